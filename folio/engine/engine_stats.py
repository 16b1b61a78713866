"""EngineStats: the engine's counters after a step, read from the scheduler (queues, KV blocks,
prefix cache, swap, waste, LoRA, speculative decoding) for metrics, logs and the dashboard."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from folio.core.scheduler import Scheduler


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    kv_cache_usage: float
    num_preemptions: int
    # Prefix caching, counted in tokens since start (a lookup per admission, resumes included).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_rate: float = 0.0  # hits / queries
    num_cached_blocks: int = 0  # blocks holding a cached full block's K/V now (used or free)
    num_evicted_blocks: int = 0  # cached blocks reallocated, since start
    # Work done: tokens put through the model since start, and of them prompt tokens.
    num_computed_tokens: int = 0
    num_computed_prompt_tokens: int = 0
    # Sharing and swapping since start.
    num_copied_blocks: int = 0  # copy-on-write copies
    num_swap_preemptions: int = 0  # of num_preemptions, those that swapped instead of recomputing
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0
    num_cpu_blocks: int = 0
    num_free_cpu_blocks: int = 0
    # KV waste, over all steps so far (core/kv_waste.py): the fraction of allocated paged KV
    # slots holding no token, and what contiguous per-request preallocation would have wasted
    # on the same running requests, reserving max_model_len or prompt + max_tokens each.
    kv_waste_fraction: float = 0.0
    kv_waste_fraction_prealloc_max_model_len: float = 0.0
    kv_waste_fraction_prealloc_max_tokens: float = 0.0
    # LoRA (enable_lora): requests per adapter name, running and waiting; GPU slots.
    lora_running: tuple[tuple[str, int], ...] = ()
    lora_waiting: tuple[tuple[str, int], ...] = ()
    max_loras: int = 0
    # Tensor parallelism: every rank holds num_blocks blocks of its own KV heads (one block
    # table for all, so the waste fractions above hold on each rank); bytes on each rank.
    tensor_parallel_size: int = 1
    kv_cache_bytes_per_rank: int = 0
    # Speculative decoding since start (core/spec_decode_stats.py): request-steps that verified
    # drafts, their draft tokens, the accepted ones, and accepted drafts at each position.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()


def collect_stats(
    s: Scheduler, num_blocks: int, tensor_parallel_size: int, kv_cache_bytes_per_rank: int
) -> EngineStats:
    """The engine's counters now, from its scheduler."""
    return EngineStats(
        num_running=s.num_running,
        num_waiting=s.num_waiting,
        num_blocks=num_blocks,
        num_free_blocks=s.kv_cache_manager.num_free_blocks,
        kv_cache_usage=s.kv_usage,
        num_preemptions=s.num_preemptions,
        tensor_parallel_size=tensor_parallel_size,
        kv_cache_bytes_per_rank=kv_cache_bytes_per_rank,
        spec_decode_num_drafts=s.spec_stats.num_drafts,
        spec_decode_num_draft_tokens=s.spec_stats.num_draft_tokens,
        spec_decode_num_accepted_tokens=s.spec_stats.num_accepted_tokens,
        spec_decode_num_accepted_tokens_per_pos=tuple(s.spec_stats.accepted_per_position),
        **_memory_stats(s),
        **_lora_stats(s),
    )


def _memory_stats(s: Scheduler) -> dict[str, Any]:
    """Prefix cache, sharing, swap and KV waste counters for EngineStats."""
    kv, waste = s.kv_cache_manager, s.waste
    cache, swap = kv.prefix_cache, kv.swap_space
    return dict(
        prefix_cache_queries=kv.prefix_cache_queries,
        prefix_cache_hits=kv.prefix_cache_hits,
        prefix_cache_hit_rate=kv.prefix_cache_hits / kv.prefix_cache_queries if kv.prefix_cache_queries else 0.0,
        num_cached_blocks=cache.num_cached_blocks if cache is not None else 0,
        num_evicted_blocks=cache.num_evicted_blocks if cache is not None else 0,
        num_computed_tokens=s.num_computed_tokens,
        num_computed_prompt_tokens=s.num_computed_prompt_tokens,
        num_copied_blocks=kv.num_copied_blocks,
        num_swap_preemptions=s.num_swap_preemptions,
        num_swapped_out_blocks=swap.num_swapped_out_blocks,
        num_swapped_in_blocks=swap.num_swapped_in_blocks,
        num_cpu_blocks=swap.num_blocks,
        num_free_cpu_blocks=swap.num_free_blocks,
        kv_waste_fraction=waste.waste_fraction,
        kv_waste_fraction_prealloc_max_model_len=waste.prealloc_max_model_len_waste_fraction,
        kv_waste_fraction_prealloc_max_tokens=waste.prealloc_max_tokens_waste_fraction,
    )


def _lora_stats(s: Scheduler) -> dict[str, Any]:
    """Requests per adapter name, running and waiting (only when LoRA is on)."""
    if s.max_loras is None:
        return {}

    def count(requests: Iterable[Any]) -> tuple[tuple[str, int], ...]:
        names = Counter(r.lora_request.lora_name for r in requests if r.lora_request is not None)
        return tuple(sorted(names.items()))

    return dict(lora_running=count(s.running), lora_waiting=count(s.waiting), max_loras=s.max_loras)
