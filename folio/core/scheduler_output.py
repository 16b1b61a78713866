"""SchedulerOutput: what one engine step computes — which requests, how many tokens, which blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from folio.core.request import Request


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: tokens [num_computed_tokens, +num_new_tokens) of it.

    With async scheduling the last of those tokens may be a placeholder: the token the previous
    step (still in flight) samples for this request. Then it is the only new token
    (num_new_tokens == 1, num_computed_tokens == request.num_tokens at schedule time) and the
    runner takes its id from the previous step's sampled ids on the device.
    """

    request: Request  # live object; the runner reads all_token_ids and sampling_params
    num_computed_tokens: int  # tokens whose K/V were cached before this step
    num_new_tokens: int  # tokens computed in this step (a prefill chunk, or 1 for a decode)
    block_ids: list[int]  # the request's block table (live list, read-only for the runner)
    # This step reaches the request's last token (known or placeholder), so it samples one.
    samples: bool
    # Speculative decoding: drafts appended after the request's last token (the last
    # len(spec_token_ids) of num_new_tokens). The step scores every one of them and samples
    # 1 + (drafts accepted) tokens. A tuple, or PendingDrafts (core/pending_drafts.py) while a
    # draft model's values are still on the device: their count is known, not yet their ids.
    spec_token_ids: Sequence[int] = ()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def end(self) -> int:
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]  # batch order
    total_num_scheduled_tokens: int
    # Requests that finished or were aborted since the last step: the runner drops their state.
    finished_req_ids: frozenset[str] = frozenset()
    preempted_req_ids: tuple[str, ...] = ()
    # Requests whose block tables lost blocks after the last step (rejected drafts' slots
    # released, core/speculation.py): ids before the end may have changed, not just appended.
    shrunk_req_ids: frozenset[str] = frozenset()
    # Block moves to run before the forward pass, in this order: swap-outs, copies, swap-ins
    # (core/kv_cache_manager.py says why the order makes them safe).
    blocks_to_copy: tuple[tuple[int, int], ...] = ()  # (src, dst) copy-on-write
    blocks_to_swap_out: tuple[tuple[int, int], ...] = ()  # (device block, cpu block)
    blocks_to_swap_in: tuple[tuple[int, int], ...] = ()  # (cpu block, device block)
    # Contract with the runner: one forward pass per step writes every scheduled token's K/V
    # before any attention reads the cache (layer by layer), because a request may read blocks
    # that another request of the same step computes (a prefix-cache hit on blocks cached this
    # step). A runner that splits a step must run requests in batch order: providers come first.

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_scheduled_requests(self) -> int:
        return len(self.scheduled)
