"""WaitingAdmission: the scheduler's admission of waiting requests into a step, head of line first.

Mixed into Scheduler (core/scheduler.py): schedule() first gives running requests their tokens,
then admits from the waiting queue with what is left of the budget, the seats (max_num_seqs)
and the blocks. Here: the admission loop, LoRA slots, parking a paused beam for a seat, and
preempting for a newcomer under the priority policy. What a newcomer shares instead of
computing is core/admission.py's; which running request gives way is core/preemption.py's.
"""

from __future__ import annotations

from folio.config.scheduler import SchedulerConfig
from folio.core.admission import allocate_admission, plan_admission, why_not_admitted
from folio.core.kv_cache_manager import KVCacheManager
from folio.core.lora_slots import LoRASlots
from folio.core.preemption import newcomer_victim
from folio.core.request import Request, RequestStatus
from folio.core.request_queue import RequestQueue
from folio.core.schedule_step import ScheduleStep


class WaitingAdmission:
    """Scheduler's methods that admit waiting requests (they preempt through Scheduler._preempt)."""

    # Scheduler's attributes these methods use (set in Scheduler.__init__).
    config: SchedulerConfig
    max_loras: int | None
    kv_cache_manager: KVCacheManager
    waiting: RequestQueue
    running: list[Request]
    head_wait: tuple[str, str] | None

    def _schedule_waiting(self, step: ScheduleStep) -> None:
        """Admit waiting requests in queue order while budget, max_num_seqs and blocks allow.

        Head of line: the first request that cannot be admitted stops admission, so smaller
        requests behind it never starve it. Without chunked prefill a request is admitted only
        with all its tokens. A newcomer short of a seat or of blocks may preempt a paused beam
        (it makes no progress while it waits for its beam search, and it may be waiting for
        this very newcomer), and under the priority policy a running request that ranks
        strictly after it (see core/preemption.py); admission then stops after that newcomer,
        since memory is short.
        """
        slots, held = LoRASlots(self.max_loras, self.running), []
        while self.waiting and step.budget > 0:
            num_preempted = len(step.preempted)
            request = self.waiting.peek()
            if not slots.fits(request):  # its adapter has no slot this step: try the next
                held.append(self.waiting.pop())
                continue
            if len(self.running) >= self.config.max_num_seqs and not self._park_a_paused_beam(request, step):
                self._note_wait("max_num_seqs")
                break
            num_new = self._allocate_for_newcomer(request, step)
            if num_new == 0:
                break
            admitted = self.waiting.pop()
            assert admitted is request  # victims rank strictly after it, so it is still first
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            step.add(request, num_new, self.kv_cache_manager.get_block_ids(request.request_id))
            slots.admit(request)
            if len(step.preempted) > num_preempted:
                break  # the next head waits: "preempting"
        for request in reversed(held):
            self.waiting.prepend(request)  # back in their places at the front
        if held:
            self.head_wait = (held[0].request_id, "lora_slot")

    def _note_wait(self, reason: str) -> None:
        self.head_wait = (self.waiting.peek().request_id, reason)

    def _park_a_paused_beam(self, newcomer: Request, step: ScheduleStep) -> bool:
        """Free a seat for the newcomer by parking the newest paused beam, if it could start."""
        paused = [r for r in self.running if r.paused]
        if not paused or plan_admission(self.kv_cache_manager, self.config, newcomer, step) is None:
            return False
        self.running.remove(paused[-1])
        self._preempt(paused[-1], step)
        return True

    def _allocate_for_newcomer(self, request: Request, step: ScheduleStep) -> int:
        """Allocate blocks for a waiting request's first tokens; how many it gets, 0 to wait.

        Under the priority policy it may preempt running requests that rank strictly after it,
        worst first, until its blocks fit. Strictness means two requests can never take
        blocks from each other in turn.
        """
        while True:
            admission = plan_admission(self.kv_cache_manager, self.config, request, step)
            if admission is None:
                self._note_wait(why_not_admitted(self.kv_cache_manager, request, step))
                return 0
            if allocate_admission(self.kv_cache_manager, request, admission):
                step.admitted.add(request.request_id)
                return admission.num_new_tokens
            victim = newcomer_victim(
                self.config.policy, self.running, request, self.kv_cache_manager.providers
            )
            if victim is None:
                self._note_wait("no_blocks")
                return 0
            self.running.remove(victim)
            self._preempt(victim, step)  # an unscheduled victim gives budget back: count again
