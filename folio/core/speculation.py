"""Speculative decoding in the scheduler's terms: drafts in, accepted tokens out.

A running request whose only uncomputed token is its last one carries the drafts its proposer
made (Request.spec_token_ids). Its step is scheduled for 1 + d tokens (d = max_drafts), which
the target scores at once; the step samples the accepted drafts plus one token of its own. At
the update, num_computed_tokens gives back the rejected drafts, and the table's blocks past it
are freed (settle_drafts). A draft model also writes its own K/V a few slots past the step
while it proposes (lookahead_slots); those slots are released with the rejected ones.

Only known tokens' blocks are ever cached (KVCacheManager._cache_full_blocks), so a block that
held a rejected draft is never in the prefix cache.
"""

from __future__ import annotations

from folio.core.kv_cache_manager import KVCacheManager
from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest
from folio.core.spec_decode_stats import SpecDecodeStats


def max_drafts(request: Request, max_model_len: int) -> int:
    """How many drafts a step may verify for the request: all of them accepted plus the bonus
    token must stay within max_tokens and max_model_len, so no step computes past the end."""
    room = max_model_len - request.num_tokens - 1
    max_tokens = request.sampling_params.max_tokens
    if max_tokens is not None:
        room = min(room, max_tokens - request.num_output_tokens - 1)
    return max(0, min(room, len(request.spec_token_ids)))


def lookahead_slots(request: Request, num_new: int, num_lookahead: int, max_model_len: int) -> int:
    """Slots past a sampling step's tokens where a draft model writes K/V while it proposes
    (never past max_model_len); none for prefill chunks and requests that do not speculate or
    will get no more drafts (reserving them anyway cost a paused draft model ~20% at batch 64:
    slots taken at each schedule, freed at each update, and the runner's block-table rows
    rebuilt)."""
    if not num_lookahead or request.drafts_stopped or not request.can_speculate:
        return 0
    end = request.num_computed_tokens + num_new
    if end < request.num_tokens_with_placeholders:
        return 0  # a prompt chunk: nothing is proposed after it
    return max(0, min(num_lookahead, max_model_len - end))


def settle_drafts(kv: KVCacheManager, stats: SpecDecodeStats, sched: ScheduledRequest, num_sampled: int) -> None:
    """A verify step sampled the accepted drafts plus one token: the rejected drafts' K/V
    leaves the cache (num_computed_tokens stops after the accepted ones) and so do the blocks
    past it, lookahead slots included."""
    num_drafted = len(sched.spec_token_ids)
    num_accepted = max(0, num_sampled - 1) if sched.samples else 0
    request = sched.request
    request.num_computed_tokens -= num_drafted - num_accepted
    kv.release_slots_past_computed(request)
    stats.observe(num_drafted, num_accepted)
