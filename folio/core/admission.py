"""Admission: what a waiting request shares instead of computing, and what it computes now.

A request leaving the waiting queue starts from the K/V it can get without computing:
- its own, back from the CPU, if it was swapped out (it keeps num_computed_tokens);
- its parent's prompt blocks, for the n > 1 samples of one request: each waits until the first
  sample (the parent) has computed all but the last prompt token in an earlier step, shares
  those blocks and computes the last prompt token itself, for its own logits (the parent's last
  block, partly filled, is copied rather than shared, since the sample writes into it);
- the longest cached prefix of its tokens (prefix caching), always leaving one token to compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from folio.config.scheduler import SchedulerConfig
from folio.core.kv_cache_manager import KVCacheManager, SharedPrefix
from folio.core.request import Request, RequestStatus
from folio.core.schedule_step import ScheduleStep


@dataclass(frozen=True)
class Admission:
    prefix: SharedPrefix | None  # None: a swap-in
    num_new_tokens: int  # computed this step, after the prefix (or the swapped-in tokens)


def plan_admission(
    kv: KVCacheManager, config: SchedulerConfig, request: Request, step: ScheduleStep
) -> Admission | None:
    """How the request would start this step; None when it cannot start now (its parent is
    still on the prompt, the budget is spent, or chunked prefill is off and it does not fit).
    Changes nothing."""
    if request.num_output_placeholders:
        return None  # preempted while a step sampling for it is in flight: its token comes first
    if kv.swap_space.holds(request.request_id):
        prefix, start = None, request.num_computed_tokens
    else:
        prefix = shared_prefix(kv, request, step)
        if prefix is None:
            return None
        start = prefix.num_tokens
    remaining = request.num_tokens - start
    num_new = min(remaining, step.budget)
    if num_new == 0 or (num_new < remaining and not config.enable_chunked_prefill):
        return None
    return Admission(prefix, num_new)


def why_not_admitted(kv: KVCacheManager, request: Request, step: ScheduleStep) -> str:
    """Why plan_admission returned None for the request (a reason of core/engine_state.py)."""
    if request.num_output_placeholders:
        return "in_flight"
    if not kv.swap_space.holds(request.request_id) and shared_prefix(kv, request, step) is None:
        return "parent"
    return "token_budget"


def shared_prefix(kv: KVCacheManager, request: Request, step: ScheduleStep) -> SharedPrefix | None:
    """The K/V the request can share; None while it waits for its running parent.

    A parent admitted in this very step is waited for too: its blocks may still be on their way
    in from the CPU when the step's copies run. A parent that is not running (finished, or
    preempted) is not waited for: the child starts on its own. A child that already sampled (it
    was preempted) resumes through the prefix cache like any request.
    """
    parent = request.parent
    fork_tokens = request.num_prompt_tokens - 1
    if parent is not None and request.num_output_tokens == 0 and fork_tokens > 0:
        if parent.status == RequestStatus.RUNNING:
            if parent.request_id in step.admitted or step.computed_before(parent) < fork_tokens:
                return None
            return kv.fork_prefix(parent, fork_tokens)
    return kv.find_cached_prefix(request)


def blocks_needed(kv: KVCacheManager, request: Request, admission: Admission) -> int:
    """Free blocks the admission takes (for checks: allocate_admission fails with fewer)."""
    if admission.prefix is None:
        return kv.blocks_needed_to_swap_in(request, admission.num_new_tokens)
    return kv.blocks_needed(request, admission.num_new_tokens, admission.prefix)


def allocate_admission(kv: KVCacheManager, request: Request, admission: Admission) -> bool:
    """Take the planned blocks; False, changing nothing, when too few are free."""
    prefix, num_new = admission.prefix, admission.num_new_tokens
    if prefix is None:
        return kv.swap_in(request, num_new)
    if not kv.allocate_slots(request, num_new, prefix):
        return False
    request.num_computed_tokens = prefix.num_tokens
    kv.count_lookup(request, prefix)
    if prefix.from_cache and request.status == RequestStatus.WAITING:  # first admission
        request.num_cached_tokens = prefix.num_tokens
    return True
