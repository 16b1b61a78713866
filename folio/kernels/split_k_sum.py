"""The split-K sum inside a GEMV launch: each program stores its float32 partial of a column tile,
and the last program to arrive (a per-tile counter taken with acq_rel after a barrier) adds them in
a fixed order, so the bits do not depend on which program ends last. Used by the W4A16 GEMV
(folio/kernels/w4a16_gemv.py) and the 16-bit one (folio/kernels/gemv.py).

(Session 12 measured a two-level sum, groups of 8 partials added as they finish and then the
groups: 3.12-3.17 vs 3.02 ms per INT4 token with one level, so it was removed.)
"""

from __future__ import annotations

import torch

from folio.kernels.triton_compat import tl, triton


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
