"""EngineState: a JSON-ready picture of the scheduler's queues and KV cache, for the dashboard.

Built on the engine's side between two steps (engine/engine_loop.py answers a StateCommand with
it), from what the scheduler already keeps: its queues, each request's counters, the block pool's
counts and the cumulative counters. Its cost is O(listed requests), at most `max_listed` per
queue; the block map (one state per KV block, and each listed request's block ids) costs
O(blocks in use + cached blocks) and is built only when asked for. docs/dashboard.md documents
every field; the frontend adds the time series (engine/state_history.py).

Why a waiting request waits (`wait_reason`): the head of the queue carries what stopped the last
schedule() from admitting it (Scheduler.head_wait); the requests behind it are "queued"; a head
that arrived after the last schedule() is "arrived".
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, TypedDict

from folio.core.kv_cache_manager import KVCacheManager
from folio.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from folio.core.scheduler import Scheduler

SCHEMA_VERSION = 1
DEFAULT_MAX_LISTED = 256

# Why a request is in the waiting queue (docs/dashboard.md says what each means).
WAIT_REASONS = ("no_blocks", "token_budget", "max_num_seqs", "preempting", "parent", "in_flight",
                "lora_slot", "queued", "arrived")

# One character per KV block in EngineState["blocks"]["device"] / ["cpu"].
FREE, CACHED, OWNED, SHARED = "f", "c", "o", "s"  # device blocks
SWAPPED = "w"  # a CPU block holding a swapped-out request's K/V
_RUNS = re.compile(rb"f+|c+|o+|s+|w+")
_RUN = re.compile(r"([fcosw])(\d+)")
_CACHED, _OWNED, _SHARED = ord(CACHED), ord(OWNED), ord(SHARED)


class RequestView(TypedDict, total=False):
    id: str
    status: str  # "running", "waiting", "preempted", "swapped" or "parked"
    priority: int
    family: str | None  # the user request of an n > 1 sample or a beam
    lora: str | None  # the LoRA adapter's name, None for the base model
    prompt_tokens: int
    output_tokens: int
    computed_tokens: int  # tokens whose K/V are (or will be, after the step in flight) cached
    cached_tokens: int  # prompt tokens served by the prefix cache at first admission
    num_blocks: int  # device KV blocks in its table
    num_cpu_blocks: int  # CPU blocks holding its swapped-out K/V
    preemptions: int
    age_s: float  # seconds since it arrived
    wait_reason: str | None  # one of WAIT_REASONS while it waits, else None
    block_ids: list[int]  # only with the block map
    cpu_block_ids: list[int]  # only with the block map


def build_engine_state(scheduler: Scheduler, *, with_blocks: bool = False,
                       max_listed: int = DEFAULT_MAX_LISTED) -> dict[str, Any]:
    """The snapshot documented in docs/dashboard.md (without the frontend's "series")."""
    if isinstance(max_listed, bool) or not isinstance(max_listed, int) or max_listed < 0:
        raise ValueError(f"max_listed must be a non-negative integer, got {max_listed!r}.")
    kv = scheduler.kv_cache_manager
    now = time.monotonic()
    running = [_view(r, kv, now, None, with_blocks) for r in scheduler.running[:max_listed]]
    waiting, swapped = _waiting_views(scheduler, now, with_blocks, max_listed)
    parked = [_view(r, kv, now, None, with_blocks) for r in list(scheduler.parked.values())[:max_listed]]
    num_swapped = len(kv.swap_space.tables)
    return {
        "version": SCHEMA_VERSION,
        "time": time.time(),
        "config": _config(scheduler),
        "kv": _kv_counts(kv),
        "counters": _counters(scheduler),
        "queues": {
            "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting) - num_swapped,
            "num_swapped": num_swapped,
            "num_parked": len(scheduler.parked),
            "running": running,
            "waiting": waiting,
            "swapped": swapped,
            "parked": parked,
        },
        "blocks": block_map(kv) if with_blocks else None,
    }


def _config(scheduler: Scheduler) -> dict[str, Any]:
    c, kv = scheduler.config, scheduler.kv_cache_manager
    return {
        "block_size": kv.block_size,
        "max_num_seqs": c.max_num_seqs,
        "max_num_batched_tokens": c.max_num_batched_tokens,
        "max_model_len": c.max_model_len,
        "policy": c.policy,
        "prefix_caching": kv.prefix_cache is not None,
    }


def _kv_counts(kv: KVCacheManager) -> dict[str, Any]:
    pool, swap = kv.block_pool, kv.swap_space
    return {
        "num_blocks": pool.num_blocks,
        "num_used_blocks": pool.num_used_blocks,
        "num_free_blocks": pool.num_free_blocks,
        "usage": pool.usage,
        "num_cached_blocks": kv.prefix_cache.num_cached_blocks if kv.prefix_cache is not None else 0,
        "num_cpu_blocks": swap.num_blocks,
        "num_free_cpu_blocks": swap.num_free_blocks,
    }


def _counters(scheduler: Scheduler) -> dict[str, Any]:
    kv = scheduler.kv_cache_manager
    queries, hits = kv.prefix_cache_queries, kv.prefix_cache_hits
    return {
        "num_preemptions": scheduler.num_preemptions,
        "num_swap_preemptions": scheduler.num_swap_preemptions,
        "num_computed_tokens": scheduler.num_computed_tokens,
        "num_computed_prompt_tokens": scheduler.num_computed_prompt_tokens,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "num_evicted_blocks": kv.prefix_cache.num_evicted_blocks if kv.prefix_cache is not None else 0,
        "num_copied_blocks": kv.num_copied_blocks,
        "num_swapped_out_blocks": kv.swap_space.num_swapped_out_blocks,
        "num_swapped_in_blocks": kv.swap_space.num_swapped_in_blocks,
    }


def _waiting_views(scheduler: Scheduler, now: float, with_blocks: bool,
                   max_listed: int) -> tuple[list[RequestView], list[RequestView]]:
    """The waiting queue in admission order, split into those holding CPU blocks and the rest."""
    kv = scheduler.kv_cache_manager
    waiting: list[RequestView] = []
    swapped: list[RequestView] = []
    head = scheduler.head_wait
    for position, request in enumerate(scheduler.waiting):
        if len(waiting) >= max_listed and len(swapped) >= max_listed:
            break
        reason = "queued"
        if position == 0:
            reason = head[1] if head is not None and head[0] == request.request_id else "arrived"
        queue = swapped if kv.swap_space.holds(request.request_id) else waiting
        if len(queue) < max_listed:
            queue.append(_view(request, kv, now, reason, with_blocks))
    return waiting, swapped


def _view(request: Request, kv: KVCacheManager, now: float, wait_reason: str | None,
          with_blocks: bool) -> RequestView:
    request_id = request.request_id
    view: RequestView = {
        "id": request_id,
        "status": _status(request, kv),
        "priority": request.priority,
        "family": request.family_id,
        "lora": request.lora_request.lora_name if request.lora_request is not None else None,
        "prompt_tokens": request.num_prompt_tokens,
        "output_tokens": request.num_output_tokens,
        "computed_tokens": request.num_computed_tokens,
        "cached_tokens": request.num_cached_tokens,
        "num_blocks": len(kv.get_block_ids(request_id)),
        "num_cpu_blocks": kv.swap_space.num_held_blocks(request_id),
        "preemptions": request.num_preemptions,
        "age_s": max(0.0, now - request.arrival_time),
        "wait_reason": wait_reason,
    }
    if with_blocks:
        view["block_ids"] = list(kv.get_block_ids(request_id))
        view["cpu_block_ids"] = list(kv.swap_space.tables.get(request_id, ()))
    return view


def _status(request: Request, kv: KVCacheManager) -> str:
    if request.status == RequestStatus.RUNNING:
        return "running"
    if kv.swap_space.holds(request.request_id):
        return "swapped"
    if request.paused:
        return "parked"
    return "preempted" if request.status == RequestStatus.PREEMPTED else "waiting"


def block_map(kv: KVCacheManager) -> dict[str, Any]:
    """The state of every device block and every CPU block, by block id, run-length encoded.

    Device: FREE (holds nothing anyone can reuse), CACHED (free, but the prefix cache still
    maps a hash to it: a later request may revive it; allocation evicts these oldest first),
    OWNED (in exactly one block table), SHARED (ref count > 1: a prefix-cache hit or a fork of
    n > 1 samples or beams). CPU: FREE or SWAPPED. Runs of one state are written as the state's
    letter and the run's length ("o3f5" is blocks 0-2 owned, 3-7 free): a large cache is mostly
    long runs, and a map of 400k blocks then weighs a few bytes rather than 400 kB per update.
    """
    pool = kv.block_pool
    device = bytearray(FREE.encode()) * pool.num_blocks
    if kv.prefix_cache is not None:
        for block_id in kv.prefix_cache.cached_among(pool.free_blocks_view()):
            device[block_id] = _CACHED
    ref_counts = pool.ref_counts()
    for table in kv.block_tables.values():
        for block_id in table:
            device[block_id] = _SHARED if ref_counts[block_id] > 1 else _OWNED
    swap = kv.swap_space
    if not swap.tables:  # the usual case: a large, idle CPU pool is one run
        return {"device": run_length(device), "cpu": f"{FREE}{swap.num_blocks}" if swap.num_blocks else ""}
    cpu = bytearray(FREE.encode()) * swap.num_blocks
    for table in swap.tables.values():
        for block_id in table:
            cpu[block_id] = ord(SWAPPED)
    return {"device": run_length(device), "cpu": run_length(cpu)}


def run_length(states: bytes | bytearray) -> str:
    return "".join(f"{chr(states[m.start()])}{m.end() - m.start()}" for m in _RUNS.finditer(states))


def expand_runs(encoded: str) -> str:
    """The inverse of run_length: one letter per block."""
    return "".join(letter * int(count) for letter, count in _RUN.findall(encoded))
