"""The split-K sum inside a GEMV launch: each program stores its float32 partial of a column tile,
and the last program to arrive (a per-tile counter taken with acq_rel after a barrier) adds them in
a fixed order, so the bits do not depend on which program ends last. Used by the W4A16 GEMV
(folio/kernels/w4a16_gemv.py) and the 16-bit one (folio/kernels/gemv.py).

With many splits (the W4A16 columns step splits K 32-64 ways) one last program adding every
partial is a serial tail at the end of each GEMV; `tree_split_sums` adds them in groups of
TREE_GROUP as the groups finish, so the last program adds only the group sums.
"""

from __future__ import annotations

import torch

from folio.kernels.triton_compat import tl, triton

# Partials per group of the two-level sum (the launcher's TREE key; 0 keeps one level).
TREE_GROUP = 8


@triton.jit
def last_split_sums(part_ptr, stride_part, out_ptr, counter_ptr, bias_ptr, pid_n, rn, n_ok, HAS_BIAS: tl.constexpr,
                    BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """The split-K sum inside a GEMV (this one and folio/kernels/gemv.py), after each program stored
    its float32 partial at part_ptr + split * stride_part + rn: the last of a column tile's
    SPLIT_K programs to arrive (a counter per tile, taken with acq_rel after a barrier) adds the
    partials in split order (the same bits whichever program ends last), plus the bias, writes the
    output and zeroes the counter for the next launch."""
    tl.debug_barrier()  # every thread's partial is stored before the counter moves
    if tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel") == SPLIT_K - 1:
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):  # unrolled: all loads in flight
            total += tl.load(part_ptr + split * stride_part + rn, mask=n_ok, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rn, total.to(out_ptr.dtype.element_ty), mask=n_ok)
        tl.atomic_xchg(counter_ptr + pid_n, 0)


@triton.jit
def tree_split_sums(part_ptr, stride_part, out_ptr, counter_ptr, pid_n, pid_k, rn, n_ok, BLOCK_N: tl.constexpr,
                    SPLIT_K: tl.constexpr, GROUP: tl.constexpr):
    """last_split_sums in two levels: the last of each group of GROUP consecutive splits adds the
    group's partials in split order into the group's first slot, then the last group to finish
    adds the group sums in group order and writes the output (no bias). Counters: GROUPS + 1 per
    column tile (tree_counters); each last arrival zeroes its own."""
    GROUPS: tl.constexpr = (SPLIT_K + GROUP - 1) // GROUP
    group = pid_k // GROUP
    first = group * GROUP
    counters = counter_ptr + pid_n * (GROUPS + 1)
    tl.debug_barrier()  # every thread's partial is stored before the counter moves
    if tl.atomic_add(counters + group, 1, sem="acq_rel") == tl.minimum(GROUP, SPLIT_K - first) - 1:
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for i in tl.static_range(GROUP):
            total += tl.load(part_ptr + (first + i) * stride_part + rn, mask=n_ok & (first + i < SPLIT_K), other=0.0,
                             cache_modifier=".cg")
        tl.store(part_ptr + first * stride_part + rn, total, mask=n_ok)  # no one reads this slot's partial again
        tl.atomic_xchg(counters + group, 0)
        tl.debug_barrier()
        if tl.atomic_add(counters + GROUPS, 1, sem="acq_rel") == GROUPS - 1:
            out = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for g in tl.static_range(GROUPS):
                out += tl.load(part_ptr + g * GROUP * stride_part + rn, mask=n_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rn, out.to(out_ptr.dtype.element_ty), mask=n_ok)
            tl.atomic_xchg(counters + GROUPS, 0)


@triton.jit
def tree_sum_splits(ptrs, stride, mask, SPLIT_K: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """The same sum as tree_split_sums (the same bits) over SPLIT_K partials at ptrs + i * stride,
    for a separate sum kernel: groups of GROUP in split order, then the groups in order."""
    out = tl.zeros((BLOCK,), dtype=tl.float32)
    for g in tl.static_range((SPLIT_K + GROUP - 1) // GROUP):
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in tl.static_range(GROUP):
            if g * GROUP + i < SPLIT_K:
                total += tl.load(ptrs + (g * GROUP + i) * stride, mask=mask, other=0.0)
        out += total
    return out


def tree_counters(tiles: int, split_k: int, group: int, device: torch.device) -> torch.Tensor:
    """The counters tree_split_sums needs: (groups + 1) per column tile."""
    return _split_counters(tiles * (triton.cdiv(split_k, group) + 1), device)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def _split_counters(tiles: int, device: torch.device) -> torch.Tensor:
    """The REDUCE GEMV's per-tile counters: zero between launches (each tile's last program
    zeroes its own), shared by every GEMM on the device (REDUCE GEMMs must run on one stream,
    one at a time), grown when a wider GEMM comes (outside graph capture; outgrown buffers are
    kept alive, since a graph captured earlier may still use them)."""
    counters = _COUNTERS.get(device)
    if counters is None or counters.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"w4a16 REDUCE: {tiles} column tiles first seen inside a CUDA graph capture; "
                               "run the GEMM once before capturing.")
        if counters is not None:
            _RETIRED.append(counters)  # a captured graph may still hold its address
        counters = _COUNTERS[device] = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
    return counters
