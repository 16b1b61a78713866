"""GEMV: one token (M = 1, batch-1 decode) times a 16-bit weight, y = x W^T (+ bias).

cuBLAS runs a one-row GEMM as a GEMM: at Llama-3.1-8B's o projection (4096 x 4096) it took 20.6 us
(1.6 TB/s) and its split-K shapes a second reduce kernel (session 8's kernel profile), and it
cannot take part in programmatic dependent launch. This kernel is the W4A16 GEMV's structure
(folio/kernels/w4a16_gemv.py) on bf16/fp16 weights:
- A program owns BLOCK_N output columns (weight rows, K contiguous: 16-byte loads along K) and a
  slice of K, walked in BLOCK_K steps; each step's weights load during the step before. Products
  accumulate element-wise in a [BLOCK_N, BLOCK_K] float32 tile, summed over K once at the end.
- K is split over programs to about four per SM (gemv_split_k's rule); each split stores a float32
  partial, and a second launch under PDL adds them in split order, adds the bias and writes the
  output (split_k_sum.sum_partials; FOLIO_GEMV_SPLIT_SUM=last: the last program of each column
  tile does it after a per-tile counter, as before session 14).
- Under PDL (triton_compat.pdl_launch) the first step's weights load before gdc_wait, while the
  kernel ahead (the norm or activation that writes x) still runs.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from folio.kernels.triton_compat import check_same_device, num_sms, pdl_launch, pdl_wait, tl, triton, use_triton_for
from folio.kernels.split_k_sum import _split_counters, last_split_sums, sum_partials
from folio.kernels.w4a16_gemv import gemv_split_k

_HALF = (torch.float16, torch.bfloat16)
# FOLIO_GEMV=0: one-row linear layers stay on cuBLAS (the A/B switch).
ENABLED = os.environ.get("FOLIO_GEMV", "1") != "0"
# Session 13 (H100, the 8B's four shapes back to back in a CUDA graph, scripts/gemv_chain.py): 16
# rows x 256-deep steps 163.3 us a layer, the former 32 x 128 167.8, cuBLAS 169.5; batch-1 decode
# 5.89 vs 6.03-6.06 ms. Session 15 (H100): 8 rows, twice the programs, 21.5 vs 23.1 us a layer of
# the 0.6B and 157.7 vs 159.4 of the 8B; batch-1 decode 0.6B 0.99 vs 1.03-1.06 ms, 8B 5.66 vs 5.72.
BLOCK_N, BLOCK_K, NUM_WARPS, BUSY = 8, 256, 4, 4
# FOLIO_GEMV_TILES="BLOCK_N,BLOCK_K,num_warps,busy" (an A/B switch for whole-model runs): the
# default tile, and the programs per SM the split aims for (gemv_split_k's `busy`).
if os.environ.get("FOLIO_GEMV_TILES"):
    BLOCK_N, BLOCK_K, NUM_WARPS, BUSY = (int(v) for v in os.environ["FOLIO_GEMV_TILES"].split(","))
# Weights load evict-first in L2: a decode reads each once per token, so they should not push the
# activations, split-K partials and KV cache out (session 13, batch-1 decode: 8B 6.06 vs 6.15 ms,
# 0.6B 1.10 vs 1.16). FOLIO_GEMV_EVICT=0 restores Triton's default policy (the A/B switch).
EVICT = os.environ.get("FOLIO_GEMV_EVICT", "1") != "0"
# Where a split GEMV's partials are added: "launch", a second kernel under programmatic dependent
# launch (split_k_sum.sum_partials), or "last", the last program of each column tile after an
# acq_rel counter (last_split_sums). FOLIO_GEMV_SPLIT_SUM picks one (the A/B switch).
SPLIT_SUM = os.environ.get("FOLIO_GEMV_SPLIT_SUM", "launch")
if SPLIT_SUM not in ("launch", "last"):
    raise ValueError(f"FOLIO_GEMV_SPLIT_SUM={SPLIT_SUM!r}: expected 'launch' or 'last'.")


@triton.jit
def _gemv_kernel(
    x_ptr,  # [1, K]
    w_ptr,  # [N, K], K contiguous
    bias_ptr,  # [N] (HAS_BIAS)
    part_ptr,  # [SPLIT_K, N] float32 partials (SPLIT_K > 1)
    out_ptr,  # [1, N]
    counter_ptr,  # [cdiv(N, BLOCK_N)] int32, zero between launches (SPLIT_K > 1)
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_wn,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
    EVICTION: tl.constexpr = "evict_first",  # the weights' L2 policy ("" Triton's default)
    REDUCE: tl.constexpr = True,  # SPLIT_K > 1: the last program of a tile adds the partials (else sum_partials)
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    w = tl.load(rows + (k_start + rk)[None, :], mask=n_ok[:, None] & (k_start + rk < k_end)[None, :], other=0.0,
                eviction_policy=EVICTION)
    pdl_wait(PDL)  # only weights above this line
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k1 = k0 + BLOCK_K
        following = tl.load(rows + (k1 + rk)[None, :], mask=n_ok[:, None] & (k1 + rk < k_end)[None, :], other=0.0,
                            eviction_policy=EVICTION)
        a = tl.load(x_ptr + k0 + rk, mask=k0 + rk < k_end, other=0.0).to(tl.float32)  # [BLOCK_K]
        acc += w.to(tl.float32) * a[None, :]
        w = following
    total = tl.sum(acc, axis=1)  # [BLOCK_N]
    if SPLIT_K == 1:
        if HAS_BIAS:
            total += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rn, total.to(out_ptr.dtype.element_ty), mask=n_ok)
    else:
        tl.store(part_ptr + pid_k * N + rn, total, mask=n_ok)
        if REDUCE:
            last_split_sums(part_ptr, N, out_ptr, counter_ptr, bias_ptr, pid_n, rn, n_ok, HAS_BIAS, BLOCK_N, SPLIT_K)


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a linear layer's call goes to the GEMV: one row, 16-bit, on CUDA, weight rows
    contiguous and K a multiple of 8 (16-byte rows)."""
    return (ENABLED and use_triton_for(x) and x.dim() == 2 and x.shape[0] == 1 and x.dtype in _HALF
            and weight.dtype == x.dtype and weight.dim() == 2 and weight.stride(1) == 1
            and weight.shape[1] % 8 == 0 and x.stride(1) == 1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear (cuBLAS), except one 16-bit row on CUDA (batch-1 decode): the GEMV. Unquantized
    linear layers and the LM head both go through here; FOLIO_GEMV=0 keeps cuBLAS for all."""
    if use_gemv(x, weight):
        return gemv(x, weight, bias)  # [1, out]
    return F.linear(x, weight, bias)  # [tokens, out]


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         split_k: int | None = None, block_n: int | None = None, block_k: int | None = None,
         num_warps: int | None = None, busy: int | None = None) -> torch.Tensor:
    """x [1, K] @ weight [N, K]^T (+ bias [N]) -> [1, N] in x's dtype, float32 accumulation."""
    if x.dim() != 2 or x.shape[0] != 1 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv: x must be [1, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}.")
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("gemv: x and weight must be contiguous along K.")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"gemv: bias must be a contiguous [{weight.shape[0]}], got {tuple(bias.shape)}.")
    block_n, block_k = block_n or BLOCK_N, block_k or BLOCK_K
    tensors = {"x": x, "weight": weight} | ({"bias": bias} if bias is not None else {})
    check_same_device(_gemv_kernel, **tensors)
    n, k = weight.shape
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias[None])
    tiles = triton.cdiv(n, block_n)
    if split_k is None:
        sms = num_sms(x.device)
        split_k = gemv_split_k(n, triton.cdiv(k, block_k) * block_k, block_n, block_k, sms, busy or BUSY)
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty splits: each one reaches the counter with a partial
    reduce = SPLIT_SUM == "last"
    if split_k > 1:
        parts = torch.empty((split_k, n), dtype=torch.float32, device=x.device)
        counters = _split_counters(tiles, x.device) if reduce else parts
    else:
        parts = counters = out
    _gemv_kernel[(tiles, split_k)](
        x, weight, bias if bias is not None else weight, parts, out, counters, n, k, k_per_split, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        EVICTION="evict_first" if EVICT else "", REDUCE=reduce,
        num_warps=num_warps or NUM_WARPS, **pdl_launch(x),
    )
    if split_k > 1 and not reduce:
        sum_partials(parts, out, bias)
    return out


def gemv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float32 product, rounded once to x's dtype."""
    y = x.float() @ weight.float().t()
    return (y + bias.float() if bias is not None else y).to(x.dtype)
