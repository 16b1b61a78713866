"""The split-K sum of the GEMVs and the W4A16 GEMM, in fixed split order (the bits do not depend
on which program ends last): a second launch under PDL (the default) or the GEMV's last program.

- sum_partials: a second launch under programmatic dependent launch. Its programs start while the
  GEMV runs and wait at gdc_wait for the partials. The default for both GEMVs since session 14
  (batch-1 decode on an H100: 8B bf16 5.72 vs 5.85 ms, 8B INT4 2.66 vs 2.87, 0.6B 1.09 vs 1.13),
  and the W4A16 tiled kernel's sum (M > 1).
- last_split_sums: inside the GEMV launch, the last program of each column tile to arrive (a
  per-tile counter taken with acq_rel after a barrier) adds them. One launch, but the fence, the
  counter round trip and the partials' loads sit on the critical path of every GEMV, and cost more
  than the kernel boundary PDL leaves (FOLIO_GEMV_SPLIT_SUM=last, and the W4A16 config key REDUCE,
  keep it for A/B runs).
Used by the W4A16 GEMV (folio/kernels/w4a16_gemv.py) and the 16-bit one (folio/kernels/gemv.py).

(Session 12 measured a two-level in-kernel sum, groups of 8 partials added as they finish and then
the groups: 3.12-3.17 vs 3.02 ms per INT4 token with one level, so it was removed.)
"""

from __future__ import annotations

import torch

from folio.kernels.triton_compat import pdl_launch, pdl_wait, tl, triton


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


@triton.jit
def _sum_partials_kernel(part_ptr, out_ptr, bias_ptr, total, stride_part, HAS_BIAS: tl.constexpr,
                         SPLIT_K: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out = the SPLIT_K partials added in split order (last_split_sums's order: the same bits),
    plus the bias, cast once; CHUNK splits' loads in flight at a time. PDL: launched while the
    GEMV runs, it waits for the partials."""
    pdl_wait(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    chunk = part_ptr + offs  # advanced a chunk at a time: split * stride can pass 2^31 for M > 1
    for s0 in range(0, SPLIT_K, CHUNK):
        for j in tl.static_range(CHUNK):
            acc += tl.load(chunk + j * stride_part, mask=ok & (s0 + j < SPLIT_K), other=0.0, cache_modifier=".cg")
        chunk += CHUNK * stride_part
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_partials(parts: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The split-K sum as a second launch: parts [SPLIT_K, ...] float32 (each split contiguous)
    -> out (one split's shape, contiguous) = their sum in split order, + bias (out of one row),
    cast to out's dtype. Under programmatic dependent launch where the device has it: one
    program per 128 outputs (a thread each), up to 32 splits' loads in flight."""
    split_k, total = parts.shape[0], out.numel()
    block = 128
    _sum_partials_kernel[(triton.cdiv(total, block),)](
        parts, out, bias if bias is not None else parts, total, parts.stride(0), HAS_BIAS=bias is not None,
        SPLIT_K=split_k, CHUNK=min(split_k, 32), BLOCK=block, num_warps=4, **pdl_launch(parts))
    return out
