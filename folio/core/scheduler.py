"""Scheduler: continuous batching over a token budget, with chunked prefill and preemption.

There is no prefill phase and no decode phase. Each request has `num_computed_tokens`, the
number of its tokens (prompt + outputs) whose K/V are in the cache; a step gives each scheduled
request its next tokens of `all_token_ids`, within `max_num_batched_tokens` for the whole step.
A prompt chunk, a decode token and the recompute of a resumed request are all that same move.

One step, as the engine drives it:
    out = scheduler.schedule()                       # who runs, how many tokens, which blocks
    runner_out = runner.execute_model(out)           # forward + sample
    core_outs = scheduler.update_from_output(out, runner_out)   # append tokens, stop checks

Scheduler's methods live in three modules: this one (requests in and out, the step, running
requests, preemption, state), core/waiting_admission.py (admitting waiting requests) and
core/step_results.py (update_from_output).

A request admitted from the waiting queue first takes whatever K/V it can share instead of
computing it (core/admission.py): its parent's prompt blocks, the longest cached prefix, or its
own blocks back from the CPU.

Preemption frees a victim's blocks by swap or by recompute; core/preemption.py states the rule.
Speculative decoding schedules a request's drafts after its last token; core/speculation.py.

Invariants between calls:
- a request is in exactly one of: `waiting` (status WAITING or PREEMPTED), `running` (RUNNING),
  `parked` (a paused beam that was preempted: no blocks, waits for its beam search), or nowhere
  (finished; forgotten here, its id reported once in finished_req_ids);
- a running request's block table covers its num_computed_tokens; waiting requests hold no
  device blocks (a swapped-out one holds CPU blocks and keeps its num_computed_tokens, the
  others have 0);
- `running` is in admission order, so under FCFS its tail is the newest request.

Async scheduling (engine/llm_engine.py drives it): the engine may call schedule() for step N+1
before update_from_output() of step N. Each scheduled request that samples holds a placeholder
(`num_output_placeholders`) from schedule() until its update, so step N+1 continues from the
token step N is sampling: the runner takes that token's id from the device. Around a
placeholder:
- a request that its placeholder will end by length (max_tokens, max_model_len) is not
  scheduled again; one that a stop token or stop string ends had its next step wasted, and
  update_from_output drops that step's result (the request is finished by then);
- a preempted request keeps its placeholder until the update appends the real token, and is not
  admitted again before then (core/admission.py);
- requests that need every step's token on the host before the next (Request.needs_sync_steps:
  penalties, beams) are counted, and the engine does not overlap steps while any exists.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from folio.config.scheduler import SchedulerConfig
from folio.core.kv_cache_manager import KVCacheManager
from folio.core.preemption import pop_victim, should_swap
from folio.core.kv_waste import KVWasteMeter
from folio.core.request import Request, RequestStatus
from folio.core.request_queue import make_request_queue
from folio.core.schedule_step import ScheduleStep
from folio.core.spec_decode_stats import SpecDecodeStats
from folio.core.speculation import lookahead_slots, max_drafts
from folio.core.step_results import StepResults
from folio.core.stop_conditions import reaches_length_cap
from folio.core.scheduler_output import SchedulerOutput
from folio.core.waiting_admission import WaitingAdmission


class Scheduler(WaitingAdmission, StepResults):
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = False,
        num_cpu_blocks: int = 0,
        max_loras: int | None = None,  # LoRA on: distinct adapters per step (core/lora_slots.py)
        num_lookahead_tokens: int = 0,
    ) -> None:
        max_len = scheduler_config.max_model_len
        if num_blocks * block_size < max_len:
            # Otherwise a request near max_model_len could preempt itself forever.
            raise ValueError(
                f"{num_blocks} KV blocks of {block_size} tokens cannot hold one request of "
                f"max_model_len={max_len}."
            )
        if scheduler_config.preemption_mode == "swap" and num_cpu_blocks == 0:
            raise ValueError("preemption_mode='swap' needs CPU swap space: set swap_space > 0.")
        self.config = scheduler_config
        self.max_loras = max_loras
        self.kv_cache_manager = KVCacheManager(
            num_blocks,
            block_size,
            enable_prefix_caching=enable_prefix_caching,
            num_cpu_blocks=num_cpu_blocks,
        )
        self.waiting = make_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.parked: dict[str, Request] = {}  # preempted paused beams, by id
        self.requests: dict[str, Request] = {}  # unfinished requests, by id
        self.waste = KVWasteMeter(block_size, max_len)
        # Counters since start, for stats.
        self.num_preemptions = 0
        self.num_swap_preemptions = 0  # of num_preemptions, those that swapped
        self.num_computed_tokens = 0  # tokens put through the model
        self.num_computed_prompt_tokens = 0  # ... of them, prompt tokens
        self._finished_since_schedule: set[str] = set()
        self._num_sync_requests = 0  # unfinished requests with needs_sync_steps
        # Why the head of the waiting queue was not admitted by the last schedule(): (its id,
        # a reason of core/engine_state.py), for the dashboard; None when nothing waited.
        self.head_wait: tuple[str, str] | None = None
        # Speculative decoding (core/speculation.py): slots a draft model writes past a step.
        # Drafts arrive with each step's results (ModelRunnerOutput.spec_token_ids).
        self.num_lookahead_tokens = num_lookahead_tokens
        self.spec_stats = SpecDecodeStats()

    # ---- requests in and out ----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id!r} is already in use.")
        if request.num_tokens > self.config.max_model_len:
            raise ValueError(
                f"Request {request.request_id!r} has {request.num_tokens} tokens, more than "
                f"max_model_len={self.config.max_model_len}."
            )
        request.status = RequestStatus.WAITING
        self._register(request)
        self.waiting.add(request)

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """Finish requests from outside (abort, stop string); unknown or finished ids are ignored."""
        if not status.is_finished:
            raise ValueError(f"{status.name} is not a finished status.")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, status)

    def fork_request(self, parent_id: str, children: list[Request]) -> None:
        """Replace a paused request by children that differ from it at most in the last token
        (beam search). Its K/V for all but that token are theirs: each child that finds a seat
        shares the parent's blocks and runs; the others wait as new requests, served by the
        prefix cache. The parent finishes (aborted); no children simply ends it.
        """
        parent = self.requests.get(parent_id)
        if parent is None or not parent.paused:
            raise ValueError(f"{parent_id!r} is not a paused request.")
        common = parent.num_tokens - 1
        for child in children:
            if child.request_id in self.requests:
                raise ValueError(f"Request id {child.request_id!r} is already in use.")
            if child.num_tokens != parent.num_tokens or child.all_token_ids[:common] != parent.all_token_ids[:common]:
                raise ValueError(f"{child.request_id!r} is not a fork of {parent_id!r}.")
        seats = self.config.max_num_seqs - len(self.running)
        seats += parent.status == RequestStatus.RUNNING
        waiting = []
        for child in children:
            child.block_hashes = parent.block_hashes[: common // self.kv_cache_manager.block_size]
            self._register(child)
            if parent.status == RequestStatus.RUNNING and seats > 0:
                child.num_computed_tokens = parent.num_computed_tokens
                self.kv_cache_manager.fork(parent, child)
                child.status = RequestStatus.RUNNING
                self.running.append(child)
                seats -= 1
            else:
                child.status = RequestStatus.WAITING
                waiting.append(child)
        for child in reversed(waiting):
            self.waiting.prepend(child)  # they resume work already under way: front of queue
        self._finish(parent, RequestStatus.FINISHED_ABORTED)

    def _register(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self._num_sync_requests += request.needs_sync_steps

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif self.parked.pop(request.request_id, None) is None:
            self.waiting.remove(request)
        request.status = status
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._num_sync_requests -= request.needs_sync_steps
        self._finished_since_schedule.add(request.request_id)

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        kv = self.kv_cache_manager
        kv.begin_step()
        step = ScheduleStep(budget=self.config.max_num_batched_tokens)
        self._schedule_running(step)
        self.head_wait = None
        # A step that had to preempt is short of blocks: admitting newcomers would only
        # preempt again next step, so they wait.
        if not step.preempted:
            self._schedule_waiting(step)
        if self.waiting and self.head_wait is None:
            self._note_wait("preempting" if step.preempted else "token_budget")
        finished = frozenset(self._finished_since_schedule)
        self._finished_since_schedule.clear()
        self._count(step)
        return step.build(finished, kv.take_block_moves(), kv.take_shrunk())

    def _count(self, step: ScheduleStep) -> None:
        for sched in step.scheduled.values():
            self.num_computed_tokens += sched.num_new_tokens
            prompt_end = min(sched.end, sched.request.num_prompt_tokens)
            self.num_computed_prompt_tokens += max(0, prompt_end - sched.num_computed_tokens)
        kv = self.kv_cache_manager
        self.waste.sample(self.running, kv.block_tables, kv.block_pool.num_used_blocks)

    def _schedule_running(self, step: ScheduleStep) -> None:
        """Give running requests their next tokens, oldest first, preempting when blocks run out.

        During the loop `self.running` holds the requests already visited (kept running, in
        order) and `pending` the ones not visited yet, so admission order is preserved.
        """
        pending = deque(self.running)
        self.running = []
        while pending and step.budget > 0:
            request = pending.popleft()
            num_new = 0 if request.paused else self._num_new_tokens(request, step.budget)
            if num_new == 0:
                # Paused for its beam search, or its sampled token has not come back yet.
                self.running.append(request)
                continue
            num_new = self._allocate_or_preempt(request, num_new, step, pending)
            if num_new > 0:
                self.running.append(request)
                block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
                step.add(request, num_new, block_ids)
            # else: the request was its own victim and is back in the waiting queue.
        self.running.extend(pending)

    def _allocate_or_preempt(
        self, request: Request, num_new: int, step: ScheduleStep, pending: deque[Request]
    ) -> int:
        """Blocks for the request's next num_new tokens, preempting victims until they fit; returns
        its token count (retaken after each preemption: a victim gives its budget back), 0 when
        it was its own victim."""
        kv, max_len = self.kv_cache_manager, self.config.max_model_len
        while not kv.allocate_slots(
            request, num_new, num_lookahead_tokens=lookahead_slots(request, num_new, self.num_lookahead_tokens, max_len)
        ):
            victim = pop_victim(self.config.policy, self.running, request, pending)
            self._preempt(victim, step)
            if victim is request:
                return 0
            num_new = self._num_new_tokens(request, step.budget)
        return num_new

    def _preempt(self, victim: Request, step: ScheduleStep) -> None:
        """Free the victim's device blocks by swap or recompute (core/preemption.py: the rule).

        Either way its output is unchanged: a swapped request resumes where it stopped, a
        recomputed one recomputes all_token_ids and continues.
        """
        step.unschedule(victim)
        victim.spec_token_ids = []  # it resumes by recompute or swap-in, not by a verify step
        kv = self.kv_cache_manager
        if should_swap(self.config.preemption_mode, victim) and kv.swap_out(victim):
            self.num_swap_preemptions += 1
        else:
            kv.free(victim)
            victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if victim.paused:
            self.parked[victim.request_id] = victim
        else:
            self.waiting.prepend(victim)
        step.preempted.append(victim.request_id)

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        # No separate max_model_len cap is needed: add_request refuses longer requests,
        # check_stop finishes a request once it reaches max_model_len tokens, and a request
        # whose placeholder reaches it is not scheduled; so num_computed_tokens + remaining
        # never exceeds it.
        if request.num_output_placeholders and reaches_length_cap(request, self.config.max_model_len):
            return 0
        remaining = request.num_tokens_with_placeholders - request.num_computed_tokens
        # Drafts follow the request's last known token: none while a sampled token is still in
        # flight (a step launched ahead of one in which the request sampled without verifying
        # them, e.g. cut to one token by the budget): they would sit behind that placeholder.
        if remaining == 1 and request.spec_token_ids and not request.num_output_placeholders:
            remaining += max_drafts(request, self.config.max_model_len)  # ScheduleStep.add takes them
        return max(0, min(remaining, budget))

    # ---- state ------------------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def requires_sync_steps(self) -> bool:
        """Whether some unfinished request needs each step's tokens before the next is planned
        (Request.needs_sync_steps): then steps must not overlap."""
        return self._num_sync_requests > 0

    def get_request(self, request_id: str) -> Request | None:
        """The unfinished request with this id, or None."""
        return self.requests.get(request_id)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_cache_manager.usage
