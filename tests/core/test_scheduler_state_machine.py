"""Random traffic on a tiny KV pool: the bookkeeping invariants hold after every operation.

Hypothesis drives a Scheduler with random adds (plain requests, n > 1 families, beam roots),
steps (random sampled tokens, some EOS), pipelined steps (async scheduling: the next step is
scheduled and run before this one's update, around placeholders, with aborts and stop-string
finishes landing while it is in flight), aborts, stop-string finishes, aborts that land between
schedule() and update_from_output(), and beam forks of paused requests; with prefix caching on
or off, a CPU swap pool or none, and each preemption mode. Prompts are drawn from a few shared
prefixes so that cache hits, same-step hits and evictions happen. The FakeModel moves and
writes K/V exactly as the runner would and reads back every position through the block tables,
so a block wrongly shared, overwritten, copied or swapped fails at the step where K/V would be
corrupted.
"""

from __future__ import annotations

import random

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from folio.core.admission import blocks_needed, plan_admission
from folio.core.block_hash import request_block_hashes
from folio.core.request import RequestStatus
from folio.core.request_queue import priority_key
from folio.core.stop_conditions import reaches_length_cap
from folio.core.schedule_step import ScheduleStep
from tests.core.fakes import EOS, FakeModel, _contents, make_request, make_scheduler

MAX_MODEL_LEN = 12
PREFIXES = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [5, 6, 7, 8, 20, 21, 22, 23, 24, 25], [30] * 10]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(["fcfs", "priority"]),
        chunked=st.booleans(),
        block_size=st.sampled_from([1, 2, 4]),
        spare_blocks=st.integers(0, 4),
        budget=st.integers(1, 16),
        max_num_seqs=st.integers(1, 4),
        caching=st.booleans(),
        cpu_blocks=st.sampled_from([0, 0, 2, 8]),
        mode=st.sampled_from([None, "recompute", "swap"]),
        beams=st.booleans(),
    )
    def setup(self, policy, chunked, block_size, spare_blocks, budget, max_num_seqs, caching,
              cpu_blocks, mode, beams):
        # Beams make every step synchronous while they live: half the runs have none, so that
        # pipelined steps overlap freely.
        self.beams = beams
        if not chunked:
            budget = max(budget, MAX_MODEL_LEN)  # the config demands it
        self.budget = budget
        self.max_num_seqs = max_num_seqs
        self.num_blocks = cdiv(MAX_MODEL_LEN, block_size) + spare_blocks
        self.num_cpu_blocks = cpu_blocks
        self.block_size = block_size
        self.sched = make_scheduler(
            self.num_blocks,
            block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=chunked,
            policy=policy,
            enable_prefix_caching=caching,
            num_cpu_blocks=cpu_blocks,
            preemption_mode=mode if cpu_blocks or mode != "swap" else None,
        )
        self.digests: dict[bytes, tuple] = {}  # block hash -> content of its last slot
        self.rng = random.Random(0)
        self.model = FakeModel(block_size, next_token=self._random_token)
        self.next_id = 0
        self.finished: set[str] = set()  # finished here, not yet reported in finished_req_ids
        self.generated: dict[str, list[int]] = {}
        self.done: set[str] = set()  # every request ever finished (ids are never reused)
        # (SchedulerOutput, ModelRunnerOutput) of steps run but not updated, oldest first: one
        # at most between rules, two while a pipelined step launches the next.
        self.pending: list = []

    def _random_token(self, request, end) -> int:
        return EOS if self.rng.random() < 0.1 else self.rng.randrange(3, 30)

    # ---- operations ---------------------------------------------------------------------
    def _prompt(self, prefix, shared, tail):
        return PREFIXES[prefix][:shared] + [40 + t for t in tail]

    @rule(
        prefix=st.integers(0, 2),
        shared=st.integers(0, 10),
        tail=st.lists(st.integers(0, 5), max_size=4),
        max_tokens=st.none() | st.integers(1, 8),
        priority=st.integers(0, 2),
        ignore_eos=st.booleans(),
        n=st.sampled_from([1, 1, 2, 3]),
    )
    def add(self, prefix, shared, tail, max_tokens, priority, ignore_eos, n):
        prompt = self._prompt(prefix, shared, tail)[:MAX_MODEL_LEN] or [41]
        parent = None
        for i in range(n):
            rid = f"r{self.next_id}"
            request = make_request(rid, prompt=prompt, max_tokens=max_tokens, priority=priority,
                                   ignore_eos=ignore_eos, arrival_time=float(self.next_id))
            if n > 1:
                request.family_id, request.parent = "fam", parent
                parent = parent or request
            self.sched.add_request(request)
            self.next_id += 1

    @precondition(lambda self: self.beams)
    @rule(prefix=st.integers(0, 2), shared=st.integers(1, 10), priority=st.integers(0, 2))
    def add_beam(self, prefix, shared, priority):
        rid = f"r{self.next_id}"
        request = make_request(rid, prompt=self._prompt(prefix, shared, [])[: MAX_MODEL_LEN - 1],
                               max_tokens=None, ignore_eos=True, priority=priority,
                               arrival_time=float(self.next_id))
        request.pause_after_sample, request.family_id = True, "beam"
        self.sched.add_request(request)
        self.next_id += 1

    # The engine forks right after an update, and beams never overlap steps: nothing in flight.
    @precondition(lambda self: not self.pending and any(r.paused for r in self.sched.requests.values()))
    @rule(pick=st.integers(0, 100), tokens=st.lists(st.integers(3, 30), max_size=3))
    def fork_beam(self, pick, tokens):
        paused = sorted(rid for rid, r in self.sched.requests.items() if r.paused)
        parent = self.sched.requests[paused[pick % len(paused)]]
        if parent.num_tokens >= MAX_MODEL_LEN:
            tokens = []
        children = []
        for token in tokens:
            child = make_request(f"r{self.next_id}", prompt=list(parent.prompt_token_ids),
                                 max_tokens=None, ignore_eos=True, priority=parent.priority,
                                 arrival_time=parent.arrival_time)
            child.append_output_token_ids(parent.output_token_ids[:-1] + [token])
            child.pause_after_sample, child.family_id = True, "beam"
            self.generated[child.request_id] = list(child.output_token_ids)
            children.append(child)
            self.next_id += 1
        self.sched.fork_request(parent.request_id, children)
        self.finished.add(parent.request_id)
        self.done.add(parent.request_id)

    @rule(seed=st.integers(0, 2**16))
    def step(self, seed):
        self.rng.seed(seed)
        self._complete_in_flight()
        self._launch()
        self._update(*self.pending[0])

    @rule(seed=st.integers(0, 2**16))
    def pipelined_step(self, seed):
        """As LLMEngine.step with async scheduling: launch the next step, then update this one."""
        self.rng.seed(seed)
        if not self.pending:
            self._launch()
        if not self.sched.requires_sync_steps:
            self._launch()
        self._update(*self.pending[0])

    def _launch(self):
        out = self._schedule()
        self.pending.append((out, self.model.execute(out)))

    def _complete_in_flight(self):
        if self.pending:
            self._update(*self.pending[0])

    @precondition(lambda self: self.sched.has_unfinished_requests())
    @rule(pick=st.integers(0, 100), abort=st.booleans())
    def finish_one(self, pick, abort):
        rid = sorted(self.sched.requests)[pick % len(self.sched.requests)]
        status = RequestStatus.FINISHED_ABORTED if abort else RequestStatus.FINISHED_STOPPED
        self.sched.finish_requests([rid], status)
        self.finished.add(rid)
        self.done.add(rid)

    @rule(seed=st.integers(0, 2**16), pick=st.integers(0, 100))
    def abort_during_step(self, seed, pick):
        self.rng.seed(seed)
        self._complete_in_flight()
        out = self._schedule()
        if out.scheduled:
            victim = out.scheduled[pick % len(out.scheduled)].request
            self.sched.finish_requests([victim.request_id], RequestStatus.FINISHED_ABORTED)
            self.finished.add(victim.request_id)
            self.done.add(victim.request_id)
        self.pending.append((out, self.model.execute(out)))
        self._update(*self.pending[0])

    def _schedule(self):
        was_running = {r.request_id for r in self.sched.running}
        out = self.sched.schedule()
        self._check_work_conserving(out, was_running)
        assert out.finished_req_ids == self.finished
        self.finished = set()
        assert out.total_num_scheduled_tokens == sum(s.num_new_tokens for s in out.scheduled)
        assert out.total_num_scheduled_tokens <= self.budget
        assert len({s.request_id for s in out.scheduled}) == len(out.scheduled)
        for s in out.scheduled:
            assert s.num_new_tokens > 0 and s.end <= MAX_MODEL_LEN
            assert s.request.status == RequestStatus.RUNNING and not s.request.paused
            if s.end > s.request.num_tokens:  # a placeholder: the step in flight samples it
                assert len(self.pending) == 1 and s.num_new_tokens == 1
                assert any(p.request_id == s.request_id and p.samples for p in self.pending[0][0].scheduled)
        # No block is written by two moves, and copies never read a block another move writes.
        written = [d for _, d in out.blocks_to_copy] + [d for _, d in out.blocks_to_swap_in]
        assert len(written) == len(set(written))
        kv = self.sched.kv_cache_manager
        for name, happened in [
            ("copy on write", out.blocks_to_copy), ("swap out", out.blocks_to_swap_out),
            ("swap in", out.blocks_to_swap_in), ("same-step hit", kv.providers),
            ("parked beam", self.sched.parked),
            ("cache hit", any(s.num_computed_tokens and s.request_id not in was_running
                              for s in out.scheduled)),
            ("placeholder", any(s.end > s.request.num_tokens for s in out.scheduled)),
            ("preempted in flight", self.pending and out.preempted_req_ids),
        ]:
            if happened:
                event(name)
        self._record_hashes()
        return out

    def _record_hashes(self):
        """Remember what every block hash stands for, to check cached blocks' contents later."""
        bs = self.block_size
        for r in self.sched.requests.values():
            for i, h in enumerate(r.block_hashes):
                digest = _contents(r.all_token_ids[: (i + 1) * bs])[-1]
                assert self.digests.setdefault(h, digest) == digest, "one hash, two contents"

    def _check_work_conserving(self, out, was_running):
        """The step leaves nothing undone that it had budget, seats and blocks for."""
        sched = self.sched
        scheduled = {s.request_id for s in out.scheduled}
        exhausted = out.total_num_scheduled_tokens == self.budget
        # A running request is skipped, or given less than all its tokens, only when the
        # budget ran out, it is a paused beam, or its placeholder ends it by length.
        skippable = lambda r: r.paused or (  # noqa: E731
            r.num_output_placeholders and reaches_length_cap(r, MAX_MODEL_LEN))
        assert exhausted or all(r.request_id in scheduled for r in sched.running if not skippable(r))
        assert exhausted or all(s.samples for s in out.scheduled)
        newcomers = [s.request for s in out.scheduled if s.request_id not in was_running]
        victims = [sched.get_request(rid) for rid in out.preempted_req_ids]
        others = [v for v in victims if v is not None and not v.paused]
        if others and sched.config.policy == "fcfs":
            assert not newcomers  # short of memory: newcomers wait
        elif others:
            # Only a better-ranked newcomer may take a running request's blocks, and admission
            # stops after it; newcomers are admitted best first.
            assert all(priority_key(v) > priority_key(n) for v in others for n in newcomers)
        if (sched.waiting and not exhausted and not out.preempted_req_ids
                and sched.num_running < self.max_num_seqs):
            head = sched.waiting.peek()
            step = ScheduleStep(
                budget=self.budget - out.total_num_scheduled_tokens,
                scheduled={s.request_id: s for s in out.scheduled},
                admitted={n.request_id for n in newcomers},
            )
            admission = plan_admission(sched.kv_cache_manager, sched.config, head, step)
            if admission is not None and not any(r.paused for r in sched.running):
                # Then the head of the queue was left waiting for blocks alone.
                kv = sched.kv_cache_manager
                assert blocks_needed(kv, head, admission) > kv.num_free_blocks

    def _update(self, out, runner_out):
        assert self.pending and self.pending[0][0] is out  # updates come in step order
        self.pending.pop(0)
        for core_out in self.sched.update_from_output(out, runner_out):
            rid = core_out.request_id
            assert rid not in self.done, "a result of a step wasted on a finished request"
            self.generated.setdefault(rid, []).extend(core_out.new_token_ids)
            if core_out.finished:
                self.finished.add(rid)
                self.done.add(rid)
                request = next(s.request for s in out.scheduled if s.request_id == rid)
                assert self.generated[rid] == request.output_token_ids
                if request.max_tokens is not None:
                    assert request.num_output_tokens <= request.max_tokens

    # ---- invariants ---------------------------------------------------------------------
    @invariant()
    def blocks_are_accounted_for(self):
        kv = self.sched.kv_cache_manager
        pool = kv.block_pool
        owned = [b for table in kv.block_tables.values() for b in table]
        for table in kv.block_tables.values():
            assert len(table) == len(set(table))
        assert pool.num_free_blocks + len(set(owned)) == self.num_blocks
        for block in range(self.num_blocks):
            # A block's ref count is the number of tables it is in; free exactly when in none.
            assert pool.ref_count(block) == owned.count(block)
            assert pool.is_free(block) == (block not in owned)
        swap = kv.swap_space
        held = [b for table in swap.tables.values() for b in table]
        assert len(held) == len(set(held))
        assert swap.num_free_blocks + len(held) + len(swap._releasing) == self.num_cpu_blocks

    @invariant()
    def cached_blocks_hold_what_their_hash_says(self):
        kv = self.sched.kv_cache_manager
        if kv.prefix_cache is None:
            return
        bs = self.block_size
        blocks = [b for _, b in kv.prefix_cache.items()]
        assert len(blocks) == len(set(blocks))
        for h, block in kv.prefix_cache.items():
            assert kv.prefix_cache.hash_of(block) == h
            assert self.model.slots.get(block * bs + bs - 1) == self.digests[h]
        for r in self.sched.running:
            table = kv.get_block_ids(r.request_id)
            full = min(r.num_computed_tokens, r.num_tokens) // bs  # placeholders are not hashed
            hashes = request_block_hashes(r, bs, full)
            for i in range(full):
                h = kv.prefix_cache.hash_of(table[i])
                assert h is None or h == hashes[i]

    @invariant()
    def placeholders_are_the_steps_in_flight(self):
        """A request holds one placeholder per scheduled step not yet updated that samples it."""
        in_flight = set()
        for out, _ in self.pending:
            in_flight |= {s.request_id for s in out.scheduled if s.samples}
        for rid, r in self.sched.requests.items():
            assert r.num_output_placeholders == (rid in in_flight)
        # Nothing the cache offers holds a placeholder: every cached block's tokens are known.
        kv = self.sched.kv_cache_manager
        for r in self.sched.running:
            table = kv.get_block_ids(r.request_id)
            for i in range(r.num_tokens // self.block_size, len(table)):
                assert kv.prefix_cache is None or kv.prefix_cache.hash_of(table[i]) is None or (
                    kv.block_pool.ref_count(table[i]) > 1)

    @invariant()
    def requests_are_where_their_status_says(self):
        sched = self.sched
        kv = sched.kv_cache_manager
        running = {r.request_id for r in sched.running}
        waiting = {r.request_id for r in sched.waiting}
        parked = set(sched.parked)
        assert len(running) == sched.num_running <= self.max_num_seqs
        assert not running & waiting and not parked & (running | waiting)
        assert running | waiting | parked == set(sched.requests)
        bs = kv.block_size
        for r in sched.running:
            assert r.status == RequestStatus.RUNNING
            table = kv.get_block_ids(r.request_id)
            assert len(table) == cdiv(r.num_computed_tokens, bs)  # covers, and no more
            if r.paused:
                assert r.num_computed_tokens == r.num_tokens - 1
        for r in list(sched.waiting) + list(sched.parked.values()):
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert kv.get_block_ids(r.request_id) == []
            if kv.swap_space.holds(r.request_id):
                assert r.num_computed_tokens > 0 and not r.paused
                assert kv.swap_space.num_held_blocks(r.request_id) == cdiv(r.num_computed_tokens, bs)
            else:
                assert r.num_computed_tokens == 0
        assert set(kv.block_tables) <= running
        assert set(kv.swap_space.tables) <= waiting

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        self.sched.finish_requests(list(self.sched.requests), RequestStatus.FINISHED_ABORTED)
        self.sched.schedule()  # the step boundary returns CPU blocks given up meanwhile
        kv = self.sched.kv_cache_manager
        assert kv.num_free_blocks == self.num_blocks and not kv.block_tables
        assert kv.swap_space.num_free_blocks == self.num_cpu_blocks and not kv.swap_space.tables
        assert not self.sched.has_unfinished_requests()


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestSchedulerStateMachine = SchedulerMachine.TestCase
