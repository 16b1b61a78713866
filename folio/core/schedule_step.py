"""ScheduleStep: the SchedulerOutput under construction, with the token budget it has left."""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.core.pending_drafts import draft_prefix
from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput


@dataclass
class ScheduleStep:
    budget: int
    scheduled: dict[str, ScheduledRequest] = field(default_factory=dict)  # batch order
    preempted: list[str] = field(default_factory=list)
    admitted: set[str] = field(default_factory=set)  # came from the waiting queue this step

    def add(self, request: Request, num_new_tokens: int, block_ids: list[int]) -> None:
        start = request.num_computed_tokens
        past_known = start + num_new_tokens - request.num_tokens_with_placeholders
        samples = past_known >= 0
        # Tokens past the known ones are the request's drafts (speculative decoding).
        drafts = draft_prefix(request.spec_token_ids, past_known) if past_known > 0 else ()
        self.scheduled[request.request_id] = ScheduledRequest(
            request, start, num_new_tokens, block_ids, samples, drafts
        )
        # From here on num_computed_tokens counts the K/V that will be cached after this step,
        # and the token this step samples is a placeholder until update_from_output.
        request.num_computed_tokens += num_new_tokens
        request.num_output_placeholders += samples
        self.budget -= num_new_tokens

    def unschedule(self, request: Request) -> None:
        """Take back a request scheduled earlier in this step, and its share of the budget."""
        sched = self.scheduled.pop(request.request_id, None)
        if sched is not None:
            request.num_computed_tokens = sched.num_computed_tokens
            request.num_output_placeholders -= sched.samples
            self.budget += sched.num_new_tokens

    def computed_before(self, request: Request) -> int:
        """The request's tokens whose K/V were in the cache when this step began."""
        sched = self.scheduled.get(request.request_id)
        return sched.num_computed_tokens if sched is not None else request.num_computed_tokens

    def build(
        self,
        finished_req_ids: frozenset[str],
        moves: tuple[tuple[tuple[int, int], ...], ...] = ((), (), ()),
        shrunk_req_ids: frozenset[str] = frozenset(),
    ) -> SchedulerOutput:
        scheduled = list(self.scheduled.values())
        copies, swap_out, swap_in = moves
        return SchedulerOutput(
            scheduled=scheduled,
            total_num_scheduled_tokens=sum(s.num_new_tokens for s in scheduled),
            finished_req_ids=finished_req_ids,
            preempted_req_ids=tuple(self.preempted),
            blocks_to_copy=copies,
            blocks_to_swap_out=swap_out,
            blocks_to_swap_in=swap_in,
            shrunk_req_ids=shrunk_req_ids,
        )
