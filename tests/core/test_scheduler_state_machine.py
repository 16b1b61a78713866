"""Random traffic on a tiny KV pool: the bookkeeping invariants hold after every operation.

Hypothesis drives a Scheduler with random adds, steps (random sampled tokens, some EOS), aborts,
stop-string finishes and aborts that land between schedule() and update_from_output(). The
FakeModel writes and reads back every token through the block tables, so a block shared by two
live requests, or a table that lost a block, fails at the step where K/V would be corrupted.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from folio.core.request import RequestStatus
from folio.core.request_queue import priority_key
from tests.core.fakes import EOS, FakeModel, make_request, make_scheduler

MAX_MODEL_LEN = 12


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
    )
    def setup(self, policy, chunked, block_size, spare_blocks, budget, max_num_seqs):
        if not chunked:
            budget = max(budget, MAX_MODEL_LEN)  # the config demands it
        self.budget = budget
        self.max_num_seqs = max_num_seqs
        self.num_blocks = cdiv(MAX_MODEL_LEN, block_size) + spare_blocks
        self.sched = make_scheduler(
            self.num_blocks,
            block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=chunked,
            policy=policy,
        )
        self.rng = random.Random(0)
        self.model = FakeModel(block_size, next_token=self._random_token)
        self.next_id = 0
        self.finished: set[str] = set()  # finished here, not yet reported in finished_req_ids
        self.generated: dict[str, list[int]] = {}

    def _random_token(self, request, end) -> int:
        return EOS if self.rng.random() < 0.1 else self.rng.randrange(3, 30)

    # ---- operations ---------------------------------------------------------------------
    @rule(
        prompt_len=st.integers(1, MAX_MODEL_LEN),
        max_tokens=st.none() | st.integers(1, 8),
        priority=st.integers(0, 2),
        ignore_eos=st.booleans(),
    )
    def add(self, prompt_len, max_tokens, priority, ignore_eos):
        rid = f"r{self.next_id}"
        self.sched.add_request(
            make_request(rid, prompt_len, max_tokens=max_tokens, priority=priority,
                         ignore_eos=ignore_eos, arrival_time=float(self.next_id))
        )
        self.next_id += 1

    @rule(seed=st.integers(0, 2**16))
    def step(self, seed):
        self.rng.seed(seed)
        out = self._schedule()
        self._update(out, self.model.execute(out))

    @precondition(lambda self: self.sched.has_unfinished_requests())
    @rule(pick=st.integers(0, 100), abort=st.booleans())
    def finish_one(self, pick, abort):
        rid = sorted(self.sched.requests)[pick % len(self.sched.requests)]
        status = RequestStatus.FINISHED_ABORTED if abort else RequestStatus.FINISHED_STOPPED
        self.sched.finish_requests([rid], status)
        self.finished.add(rid)

    @rule(seed=st.integers(0, 2**16), pick=st.integers(0, 100))
    def abort_during_step(self, seed, pick):
        self.rng.seed(seed)
        out = self._schedule()
        if out.scheduled:
            victim = out.scheduled[pick % len(out.scheduled)].request
            self.sched.finish_requests([victim.request_id], RequestStatus.FINISHED_ABORTED)
            self.finished.add(victim.request_id)
        self._update(out, self.model.execute(out))

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
            assert s.request.status == RequestStatus.RUNNING
        return out

    def _check_work_conserving(self, out, was_running):
        """The step leaves nothing undone that it had budget, seats and blocks for."""
        sched = self.sched
        scheduled = {s.request_id for s in out.scheduled}
        exhausted = out.total_num_scheduled_tokens == self.budget
        # A running request is skipped, or given less than all its tokens, only when the
        # budget ran out.
        assert exhausted or all(r.request_id in scheduled for r in sched.running)
        assert exhausted or all(s.end == s.request.num_tokens for s in out.scheduled)
        newcomers = [s.request for s in out.scheduled if s.request_id not in was_running]
        if out.preempted_req_ids and sched.config.policy == "fcfs":
            assert not newcomers  # short of memory: newcomers wait
        elif out.preempted_req_ids:
            # Only a better-ranked newcomer may take a running request's blocks, and admission
            # stops after it; newcomers are admitted best first.
            victims = [sched.get_request(rid) for rid in out.preempted_req_ids]
            assert all(
                priority_key(v) > priority_key(n) for v in victims if v for n in newcomers
            )
        elif sched.waiting and not exhausted and sched.num_running < self.max_num_seqs:
            head = sched.waiting.peek()
            num_new = min(head.num_tokens, self.budget - out.total_num_scheduled_tokens)
            if sched.config.enable_chunked_prefill or num_new == head.num_tokens:
                # Then the head of the queue was left waiting for blocks alone.
                kv = sched.kv_cache_manager
                assert kv.num_missing_blocks(head, num_new) > kv.num_free_blocks

    def _update(self, out, runner_out):
        for core_out in self.sched.update_from_output(out, runner_out):
            rid = core_out.request_id
            self.generated.setdefault(rid, []).extend(core_out.new_token_ids)
            if core_out.finished:
                self.finished.add(rid)
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
        assert len(owned) == len(set(owned)), "a block is in two tables"
        assert pool.num_free_blocks + len(owned) == self.num_blocks
        for block in range(self.num_blocks):
            assert pool.ref_count(block) == owned.count(block)
            assert pool.is_free(block) == (block not in owned)

    @invariant()
    def requests_are_where_their_status_says(self):
        sched = self.sched
        running = {r.request_id for r in sched.running}
        waiting = {r.request_id for r in sched.waiting}
        assert len(running) == sched.num_running <= self.max_num_seqs
        assert not running & waiting and running | waiting == set(sched.requests)
        bs = sched.kv_cache_manager.block_size
        for r in sched.running:
            assert r.status == RequestStatus.RUNNING
            table = sched.kv_cache_manager.get_block_ids(r.request_id)
            assert len(table) == cdiv(r.num_computed_tokens, bs)  # covers, and no more
        for r in sched.waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert r.num_computed_tokens == 0
            assert sched.kv_cache_manager.get_block_ids(r.request_id) == []
        assert set(sched.kv_cache_manager.block_tables) <= running

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        self.sched.finish_requests(list(self.sched.requests), RequestStatus.FINISHED_ABORTED)
        kv = self.sched.kv_cache_manager
        assert kv.num_free_blocks == self.num_blocks and not kv.block_tables
        assert not self.sched.has_unfinished_requests()


SchedulerMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None
)
TestSchedulerStateMachine = SchedulerMachine.TestCase
