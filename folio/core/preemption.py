"""Preemption: which running request gives up its blocks, and whether by swap or recompute.

Two modes free a victim's device blocks:
- recompute: drop its K/V; when admitted again it recomputes all_token_ids, minus whatever the
  prefix cache still holds of them (its own full blocks stay cached until evicted);
- swap: copy its K/V to the CPU pool and back when admitted again; nothing is recomputed, and
  blocks the prefix cache still holds are re-shared instead of copied back.

The rule (SchedulerConfig.preemption_mode forces either mode), vLLM v0's:
- a lone request is recomputed. The PagedAttention paper measured recompute and swap about
  equal at block size 16; recompute needs no CPU memory and no PCIe transfer that holds up the
  step, and the prefix cache often serves part of it.
- a member of a fork family (the n > 1 samples of a request) is swapped. Its siblings are
  usually preempted with it, one by one, and each recompute would redo that member's own
  outputs (and, with prefix caching off, the whole shared prompt once per member); a swap keeps
  every member's work.
A swap falls back to recompute when the CPU pool is too full, and a paused beam is always
dropped: its beam search replaces it by new requests anyway.
"""

from __future__ import annotations

from collections import deque

from folio.core.request import Request
from folio.core.request_queue import priority_key


def should_swap(preemption_mode: str | None, victim: Request) -> bool:
    if victim.paused:
        return False
    if preemption_mode is None:
        preemption_mode = "swap" if victim.family_id is not None else "recompute"
    return preemption_mode == "swap"


def pop_victim(policy: str, visited: list[Request], request: Request, pending: deque[Request]) -> Request:
    """Take the running request to preempt so that `request` can grow, out of its list.

    `visited` are the running requests older than `request` (already kept this step),
    `pending` the newer ones. FCFS: the most recently admitted running request, as in vLLM
    (the last to join has the weakest claim). Priority: the largest (priority, arrival_time),
    the most recently admitted on ties.
    """
    if policy == "fcfs":
        return pending.pop() if pending else request
    candidates = [*visited, request, *pending]  # admission order
    victim = max(reversed(candidates), key=priority_key)
    if victim in pending:
        pending.remove(victim)
    elif victim is not request:
        visited.remove(victim)
    return victim


def newcomer_victim(
    policy: str, running: list[Request], request: Request, providers: set[str]
) -> Request | None:
    """The running request a waiting one may preempt: the newest paused beam (it makes no
    progress until its beam search acts, which may wait for this very newcomer); else, under
    the priority policy only, the worst-ranked request if it ranks strictly after the newcomer.
    Providers are exempt: they compute blocks that a request admitted this step shares, and
    unscheduling them would leave it reading K/V that nobody computes."""
    paused = [r for r in running if r.paused]
    if paused:
        return paused[-1]
    candidates = [r for r in running if r.request_id not in providers]
    if policy != "priority" or not candidates:
        return None
    victim = max(reversed(candidates), key=priority_key)
    return victim if priority_key(victim) > priority_key(request) else None
