"""FP8 (e4m3) W8A8 GEMM in Triton for the token counts of decode, where cuBLASLt falls short.

Why: torch._scaled_mm with row-wise scales runs every shape on one cuBLASLt config (128 x 128
tiles, no split-K). At decode's token counts that is 32-48 programs for the 8B's o, QKV and down
projections on 132 SMs: the FP8 GEMMs of a W1 step read their weights at ~36% of the copy rate
and run barely faster than the bf16 ones (docs/perf-notes.md, session 11).

Design: the weight's rows are the MMA's M side ("swap AB"): a program owns BLOCK_N output
channels x BLOCK_M tokens, acc[BLOCK_N, BLOCK_M] = w[BLOCK_N, K] @ x[BLOCK_M, K]^T, so a handful
of tokens still fills a 64-row wgmma; both operands are K-contiguous, which the FP8 tensor cores
need. Programs next to each other share a weight tile (token tiles vary fastest, for L2). K is
split until about one program per SM; each split stores a float32 partial and
_fp8_sum_splits_kernel adds them, applies the scales and the bias and casts, once. Without a
split the same epilogue runs in the GEMM. y[m, n] = acc[n, m] * x_scale[m] * w_scale[n] + b[n].
"""

from __future__ import annotations

import json
import os

import torch

from folio.kernels.triton_compat import check_same_device, num_sms, pdl_launch, pdl_wait, tl, triton

# Token counts up to this go to the Triton kernel on CUDA; above it, cuBLASLt. Measured (session 11,
# H100, docs/perf-notes.md): at 16-128 tokens the Triton kernel is ahead on the 8B's QKV, o and down
# projections (down at 16 tokens: 26 us against 45); at 256 cuBLASLt is level or ahead.
# FOLIO_FP8_GEMM=cublas sends every shape to cuBLASLt (the A/B switch).
TRITON_MAX_M = 128
USE_TRITON_GEMM = os.environ.get("FOLIO_FP8_GEMM", "triton") != "cublas"
# Config keys to override for whole-model A/B runs, e.g. FOLIO_FP8_GEMM_CONFIG='{"BLOCK_N": 64}'.
CONFIG_OVERRIDES = json.loads(os.environ.get("FOLIO_FP8_GEMM_CONFIG", "{}"))


@triton.jit
def _fp8_gemm_kernel(
    x_ptr,  # [M, K] fp8, rows strided, K contiguous
    w_ptr,  # [N, K] fp8, K contiguous
    xs_ptr,  # [M] float32: per-token scales
    ws_ptr,  # [N] float32: per-channel scales
    bias_ptr,  # [N] (HAS_BIAS)
    c_ptr,  # [SPLIT_K, M, N] float32 partials, or [M, N] in the output dtype when SPLIT_K == 1
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_wn,
    stride_cs,
    stride_cm,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # every split's K range is whole BLOCK_K steps inside K: no masks
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch: launched during the kernel ahead, waits here
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_n = pid // tiles_m
    pid_m = pid % tiles_m
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    # Rows past the end read row 0 again (in bounds, no load masks); their results are not stored.
    rn_in = tl.where(rn < N, rn, 0).to(tl.int64)
    rm_in = tl.where(rm < M, rm, 0).to(tl.int64)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_ptrs = w_ptr + rn_in[:, None] * stride_wn + (k_start + rk)[None, :]
    x_ptrs = x_ptr + rm_in[:, None] * stride_xm + (k_start + rk)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    pdl_wait(PDL)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
        else:
            k_ok = (k0 + rk) < k_end
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)  # [BLOCK_N, BLOCK_M]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out_mask = (rn < N)[:, None] & (rm < M)[None, :]
    # c[m, n] from acc[n, m]; int64 offsets (a large M x N or split count overflows int32)
    c = c_ptr + pid_k.to(tl.int64) * stride_cs + rm.to(tl.int64)[None, :] * stride_cm + rn[:, None]
    if SPLIT_K == 1:
        y = acc * tl.load(xs_ptr + rm_in)[None, :] * tl.load(ws_ptr + rn_in)[:, None]
        if HAS_BIAS:
            y += tl.load(bias_ptr + rn_in).to(tl.float32)[:, None]
        tl.store(c, y.to(c_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(c, acc, mask=out_mask)


@triton.jit
def _fp8_sum_splits_kernel(
    part_ptr,  # [SPLIT_K, M * N] float32
    xs_ptr,  # [M] float32
    ws_ptr,  # [N] float32
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N] contiguous, the output dtype
    total,  # M * N
    N,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """out = (sum over splits of the partials) * x_scale * w_scale + bias, cast once."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    pdl_wait(PDL)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    ptrs = part_ptr + offs
    for _ in tl.static_range(SPLIT_K):  # unrolled: all partial loads in flight
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += total
    m = offs // N
    n = offs % N
    y = acc * tl.load(xs_ptr + m, mask=mask, other=0.0) * tl.load(ws_ptr + n, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def pick_config(m: int, n: int, k: int, num_sms: int = 132) -> dict[str, int]:
    """Tile and split for M tokens: the token tile just covers M (16..64 rows), weight tiles of
    128 channels, and K split until about one program per SM with >= 8 K steps per split (two
    per SM and >= 4 steps measured 5-40% slower at 16-256 tokens: session 11, call 1)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    cfg = {"BLOCK_M": block_m, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4, **CONFIG_OVERRIDES}
    if "SPLIT_K" not in cfg:
        cfg["SPLIT_K"] = split_k_for(m, n, k, cfg, num_sms)
    return cfg


def split_k_for(m: int, n: int, k: int, cfg: dict[str, int], num_sms: int, busy: int = 1, min_steps: int = 8) -> int:
    """Double the split until about `busy` programs per SM, keeping >= min_steps K steps each."""
    tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    split = 1
    while tiles * split < busy * num_sms and k // (cfg["BLOCK_K"] * split * 2) >= min_steps:
        split *= 2
    return split


def fp8_gemm_triton(
    x_q: torch.Tensor,  # [M, K] fp8, K contiguous
    x_scale: torch.Tensor,  # [M, 1] float32
    w_q: torch.Tensor,  # [N, K] fp8, contiguous
    w_scale: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None,  # [N]
    out_dtype: torch.dtype,
    config: dict[str, int] | None = None,
) -> torch.Tensor:  # [M, N]
    """Triton launcher: (x_q * x_scale) @ (w_q * w_scale)^T + bias in out_dtype."""
    _check(x_q, x_scale, w_q, w_scale, bias)
    tensors = {"x_q": x_q, "w_q": w_q, "x_scale": x_scale, "w_scale": w_scale} | ({"bias": bias} if bias is not None else {})
    check_same_device(_fp8_gemm_kernel, **tensors)
    m, k = x_q.shape
    n = w_q.shape[0]
    sms = num_sms(x_q.device)
    cfg = dict(config or pick_config(m, n, k, sms))
    block_k = cfg["BLOCK_K"]
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.pop("SPLIT_K", 1)), block_k) * block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty splits
    xs = x_scale.reshape(-1).float().contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0:
        return out
    part = out if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=x_q.device)
    bias_arg = bias if bias is not None else w_scale
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split_k)
    _fp8_gemm_kernel[grid](
        x_q, w_q, xs, w_scale, bias_arg, part, m, n, k, k_per_split,
        x_q.stride(0), w_q.stride(0), part.stride(0) if split_k > 1 else 0, n,
        HAS_BIAS=bias is not None, SPLIT_K=split_k, EVEN_K=k % k_per_split == 0 and k_per_split % block_k == 0,
        **cfg, **pdl_launch(x_q),
    )
    if split_k > 1:
        block = 1024
        _fp8_sum_splits_kernel[(triton.cdiv(m * n, block),)](
            part, xs, w_scale, bias_arg, out, m * n, n, HAS_BIAS=bias is not None, SPLIT_K=split_k, BLOCK=block, num_warps=4,
            **pdl_launch(x_q),
        )
    return out


def _check(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
    fp8 = torch.float8_e4m3fn
    if x_q.dtype != fp8 or w_q.dtype != fp8 or x_q.dim() != 2 or w_q.dim() != 2:
        raise ValueError(f"fp8 gemm: x_q and w_q must be 2-D float8_e4m3fn, got {x_q.dtype} {tuple(x_q.shape)}, {w_q.dtype} {tuple(w_q.shape)}.")
    m, k = x_q.shape
    n = w_q.shape[0]
    if w_q.shape[1] != k or x_q.stride(1) != 1 or not w_q.is_contiguous():
        raise ValueError(f"fp8 gemm: x_q [M, K] with contiguous rows and contiguous w_q [N, K], got {tuple(x_q.shape)}, {tuple(w_q.shape)}.")
    if x_scale.numel() != m or w_scale.numel() != n or w_scale.dtype != torch.float32 or not w_scale.is_contiguous():
        raise ValueError(f"fp8 gemm: x_scale [M, 1] and contiguous float32 w_scale [N], got {tuple(x_scale.shape)}, {tuple(w_scale.shape)}.")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"fp8 gemm: bias must be a contiguous [N] = [{n}], got {tuple(bias.shape)}.")
