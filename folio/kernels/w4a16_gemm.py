"""W4A16 GEMM: 16-bit activations times 4-bit weights dequantized inside the Triton kernel.

The one internal layout every INT4 checkpoint format is repacked into on load:
  qweight [K/8, N] int32: input row 8i + j of column n sits in bits 4j..4j+3 of qweight[i, n],
    as an unsigned value 0..15;
  scales [K/G, N] float32 and zeros [K/G, N] uint8 (None: symmetric, zero 8):
    w[k, n] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n].
Design: a program owns a BLOCK_M x BLOCK_N tile of the output and walks its share of K in
BLOCK_K steps; BLOCK_K divides G, so each step reads one row of scales/zeros. Weights are
unpacked with shifts, scaled in float32, rounded to the activation dtype and fed to tl.dot
with a float32 accumulator. Decode (small M) is bound by reading the weight: split-K gives
the GPU enough programs to saturate memory bandwidth, each writing a float32 partial that
split_k_sum.sum_partials adds up and casts in one pass. One token (M = 1) takes a GEMV kernel
without tl.dot (which would pad it to 16 rows), with wide tiles (folio/kernels/w4a16_gemv.py).
Large M dequantizes once and calls cuBLAS (M >= DEQUANT_MIN_M).
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

from folio.kernels.triton_compat import check_same_device, num_sms, pdl_launch, tl, triton, use_triton_for
from folio.kernels.split_k_sum import _split_counters, sum_partials
from folio.kernels.w4a16_gemv import (  # noqa: F401 (gemv_split_k: re-exported for the benchmark)
    _group_scale_zero,
    _w4a16_gemv_kernel,
    GEMV_STEPS,
    STEP_DEFAULT,
    columns_split_k,
    gemv_split_k,
)

PACK = 8  # int4 values per int32
# From this many tokens on, dequantize + cuBLAS beats the fused kernel (to be measured on H100).
DEQUANT_MIN_M = 256
# Unpack through exponent bits (_nibbles_to_float); FOLIO_W4A16_MAGIC=0 converts (the A/B switch).
MAGIC_DEFAULT = int(os.environ.get("FOLIO_W4A16_MAGIC", "1") != "0")
# The one-token GEMV's config keys to change (an A/B switch for whole-model runs), e.g.
# FOLIO_W4A16_GEMV_CONFIG='{"REDUCE": 1, "BLOCK_K": 64}'; SPLIT_K follows the tile unless given.
GEMV_OVERRIDES = json.loads(os.environ.get("FOLIO_W4A16_GEMV_CONFIG", "{}"))


@triton.jit
def _nibbles_to_float(nibbles, MAGIC: tl.constexpr):
    """int32 values 0..15 -> the same values in float32. MAGIC: OR them into the mantissa of
    2^23 (0x4B000000) and subtract 2^23, both exact: an integer op and a float add instead of an
    int-to-float conversion, which runs at a quarter of the FP32 rate on Hopper and made the
    batch-1 GEMV compute-bound (1.1 TB/s, session 5; docs/perf-notes.md)."""
    if MAGIC:
        return (nibbles | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return nibbles.to(tl.float32)


@triton.jit
def _w4a16_kernel(
    a_ptr,  # [M, K] fp16/bf16/fp32
    qw_ptr,  # [K / 8, N] int32
    s_ptr,  # [K / G, N] float32
    z_ptr,  # [K / G, N] uint8 (HAS_ZEROS)
    c_ptr,  # [SPLIT_K, M, N]: float32 partials, or the output dtype when SPLIT_K == 1
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_am,
    stride_ak,
    stride_qk,
    stride_sg,
    stride_cs,
    stride_cm,
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 activations: exact, like the CPU path
    MAGIC: tl.constexpr,  # unpack by exponent bits, not int-to-float conversions (_nibbles_to_float)
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    rk8 = tl.arange(0, BLOCK_K // 8)
    shifts = tl.arange(0, 8) * 4  # [8]: nibble j of a word holds input row 8i + j
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + rk
        k_ok = ks < k_end
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=m_ok[:, None] & k_ok[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        packed = tl.load(
            qw_ptr + (k0 // 8 + rk8)[:, None] * stride_qk + rn[None, :],
            mask=(k0 + rk8 * 8 < k_end)[:, None] & n_ok[None, :],
            other=0,
        )  # [BLOCK_K / 8, BLOCK_N] int32: each word read once
        nibbles = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [BLOCK_K / 8, 8, BLOCK_N]
        q = _nibbles_to_float(tl.reshape(nibbles, (BLOCK_K, BLOCK_N)), MAGIC)  # row 8i + j = nibble j of word i
        s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok, HAS_ZEROS, BLOCK_N)
        w = ((q - z[None, :]) * s[None, :]).to(a.dtype)  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
    c = c_ptr + pid_k * stride_cs + rm[:, None] * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def w4a16_linear(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [K / 8, N] int32
    scales: torch.Tensor,  # [K / G, N] float32
    zeros: torch.Tensor | None,  # [K / G, N] uint8
    group_size: int,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N] in x's dtype
    """x @ W + b: the fused kernel on CUDA at small M, else dequantize and matmul."""
    if use_triton_for(x) and x.shape[0] < DEQUANT_MIN_M:
        out = w4a16_gemm_triton(x, qweight, scales, zeros, group_size)
        return out if bias is None else out + bias
    return w4a16_reference(x, qweight, scales, zeros, group_size, bias)


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int) -> None:
    m, k = x.shape
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"w4a16: activations must be fp16, bf16 or fp32, got {x.dtype}.")
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or qweight.shape[0] * PACK != k:
        raise ValueError(f"w4a16: qweight must be int32 [K/8, N] = [{k // PACK}, N], got {qweight.dtype} {tuple(qweight.shape)}.")
    n = qweight.shape[1]
    if group_size % 32 or k % group_size:
        raise ValueError(f"w4a16: group size {group_size} must be a multiple of 32 dividing K={k}.")
    if scales.dtype != torch.float32 or tuple(scales.shape) != (k // group_size, n):
        raise ValueError(f"w4a16: scales must be float32 [{k // group_size}, {n}], got {scales.dtype} {tuple(scales.shape)}.")
    if zeros is not None and (zeros.dtype != torch.uint8 or zeros.shape != scales.shape):
        raise ValueError(f"w4a16: zeros must be uint8 {tuple(scales.shape)}, got {zeros.dtype} {tuple(zeros.shape)}.")
    if not (qweight.is_contiguous() and scales.is_contiguous() and (zeros is None or zeros.is_contiguous())):
        raise ValueError("w4a16: qweight, scales and zeros must be contiguous.")


def pick_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> dict[str, int]:
    """Tile sizes and split-K: small M splits K until about two programs per SM; one token
    takes the GEMV kernel (GEMV=1) with wide tiles, split until about four programs per SM."""
    if m == 1:
        if STEP_DEFAULT == GEMV_STEPS["chains"]:
            # Session 15 (H100, the 8B): one FMA chain per column, one-warp programs of 128
            # columns (4 a thread) x 32 K rows, activations and scales one step ahead, the
            # columns step's split: batch-1 decode INT4 2.56 vs 2.66 ms (docs/perf-notes.md).
            cfg = {"GEMV": 1, "STEP": 4, "BLOCK_N": 128, "BLOCK_K": 32, "REDUCE": 0, "AHEAD": 1, "num_warps": 1}
        elif STEP_DEFAULT == GEMV_STEPS["columns"]:
            # Session 12 (H100, the 8B's shapes): one-warp programs of 256 columns x 32 K rows,
            # K split to the most programs that still walk >= 4 steps each (docs/perf-notes.md).
            # Session 14: the partials added by a second launch under PDL (split_k_sum.sum_partials),
            # not by each tile's last program after a counter (REDUCE 1, the A/B key): batch-1
            # decode of the 8B 2.34 vs 2.53-2.57 ms on an H200.
            cfg = {"GEMV": 1, "STEP": 3, "BLOCK_N": 256, "BLOCK_K": 32, "REDUCE": 0, "num_warps": 1}
        else:
            # Session 8 (batch-1 decode of the 8B): BLOCK_K 64 with the split-K sum in the GEMV
            # 3.27 ms, BLOCK_K 128 with the second launch 3.69.
            cfg = {"GEMV": 1, "BLOCK_N": 128, "BLOCK_K": 64, "REDUCE": 1, "num_warps": 4}
        cfg.update(GEMV_OVERRIDES)
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], group_size)
        min_steps = cfg.pop("MIN_STEPS", 4)  # columns: K steps per program at least (an A/B key)
        if "SPLIT_K" not in cfg:
            if cfg.get("STEP", STEP_DEFAULT) in (GEMV_STEPS["columns"], GEMV_STEPS["chains"]):
                cfg["SPLIT_K"] = columns_split_k(k, cfg["BLOCK_K"], min_steps)
            else:  # about 16 warps per SM
                cfg["SPLIT_K"] = gemv_split_k(n, k, cfg["BLOCK_N"], cfg["BLOCK_K"], num_sms, max(1, 16 // cfg["num_warps"]))
        return cfg
    block_k = 64 if group_size % 64 == 0 else 32
    busy, steps, stages = 2, 4, None  # programs per SM to aim for; min K steps per split; pipeline depth
    if m <= 16:  # measured (docs/perf-notes.md, session 5): 128-deep K steps, 4 stages, ~4 programs per SM, >= 8 steps per split
        block_m, block_n, warps, busy, steps, stages = 16, 64, 4, 4, 8, 4
        block_k = 128 if group_size % 128 == 0 else block_k
    elif m <= 64:
        block_m, block_n, warps = 32, 64, 4
    else:
        block_m, block_n, warps = 64, 128, 8
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split_k = 1
    while tiles * split_k < busy * num_sms and k // (block_k * split_k * 2) >= steps:
        split_k *= 2
    config = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, num_warps=warps)
    return config if stages is None else {**config, "num_stages": stages}


def w4a16_gemm_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """Triton launcher: x [M, K] @ W [K, N] -> [M, N] in x's dtype (no bias)."""
    _check(x, qweight, scales, zeros, group_size)
    check_same_device(_w4a16_kernel, x=x, qweight=qweight, scales=scales)
    m, k = x.shape
    n = qweight.shape[1]
    sms = num_sms(x.device)
    cfg = dict(config or pick_config(m, n, k, group_size, sms))
    gemv = bool(cfg.pop("GEMV", 0))
    reduce_in_kernel = bool(cfg.pop("REDUCE", 0))  # GEMV only: the split-K sum in the same launch
    magic = int(cfg.pop("MAGIC", MAGIC_DEFAULT))  # unpack through exponent bits (_nibbles_to_float); 0: conversions
    step = int(cfg.pop("STEP", STEP_DEFAULT))  # GEMV only: its K step (w4a16_gemv.GEMV_STEPS)
    prefetch = int(cfg.pop("PREFETCH", 1))  # GEMV with STEP 2: words loaded one step ahead
    ahead = int(cfg.pop("AHEAD", 1))  # GEMV with STEP 4: activations and scales one K step ahead
    evict = int(cfg.pop("EVICT", 1))  # GEMV with STEP 3: words evict-first in L2 (session 13: 2.77-2.92 vs 3.01 ms)
    if gemv and m != 1:
        raise ValueError(f"w4a16: the GEMV kernel takes one row, got M={m}.")
    if gemv and step not in GEMV_STEPS.values():
        raise ValueError(f"w4a16: GEMV STEP {step} is not one of {GEMV_STEPS}.")
    if gemv and step == GEMV_STEPS["chains"] and cfg["BLOCK_K"] != 32:
        raise ValueError(f"w4a16: the GEMV's chains step takes BLOCK_K 32, got {cfg['BLOCK_K']}.")
    split_k = cfg.pop("SPLIT_K")
    num_warps = cfg.pop("num_warps", 4)
    num_stages = cfg.pop("num_stages", None)  # None: Triton's default
    launch = dict(num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}))
    if "maxnreg" in cfg:  # a register cap per thread (an A/B key for the GEMV's occupancy)
        launch["maxnreg"] = int(cfg.pop("maxnreg"))
    block_k = cfg["BLOCK_K"]
    if group_size % block_k:
        raise ValueError(f"w4a16: BLOCK_K={block_k} must divide the group size {group_size}.")
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty splits (each would launch, sum and store zeros)
    out_dtype = x.dtype if split_k == 1 else torch.float32
    out = torch.empty((split_k, m, n), dtype=out_dtype, device=x.device)
    zeros_arg = zeros if zeros is not None else scales
    if gemv:
        tiles = triton.cdiv(n, cfg["BLOCK_N"])
        reduce = reduce_in_kernel and split_k > 1
        result = torch.empty((m, n), dtype=x.dtype, device=x.device) if reduce else out
        _w4a16_gemv_kernel[(tiles, split_k)](
            x, qweight, scales, zeros_arg, out, n, k, k_per_split,
            x.stride(1), qweight.stride(0), scales.stride(0), out.stride(0),
            result, _split_counters(tiles, x.device) if reduce else out,
            GROUP=group_size, HAS_ZEROS=zeros is not None, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k,
            SPLIT_K=split_k, REDUCE=reduce, STEP=step, PREFETCH=prefetch, EVEN_N=n % cfg["BLOCK_N"] == 0,
            EVICTION="evict_first" if evict else "", AHEAD=ahead,
            **launch, **pdl_launch(x),
        )
        if reduce:
            return result  # [1, N]
    else:
        grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]), split_k)
        _w4a16_kernel[grid](
            x, qweight, scales, zeros_arg, out,
            m, n, k, k_per_split,
            x.stride(0), x.stride(1), qweight.stride(0), scales.stride(0), out.stride(0), out.stride(1),
            GROUP=group_size, HAS_ZEROS=zeros is not None,
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", MAGIC=magic, **launch, **cfg,
        )
    if split_k == 1:
        return out[0]  # [M, N]
    return sum_partials(out, torch.empty((m, n), dtype=x.dtype, device=x.device))  # [M, N]


def unpack_rows(qweight: torch.Tensor) -> torch.Tensor:
    """[K/8, N] int32 -> [K, N] uint8 (0..15): the inverse of pack_rows."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)  # [8]
    q = (qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & 0xF  # [K/8, 8, N]
    return q.reshape(-1, qweight.shape[1]).to(torch.uint8)


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """[K, N] values 0..15 -> [K/8, N] int32, row 8i + j in bits 4j of row i."""
    k, n = q.shape
    v = q.to(torch.int32).reshape(k // PACK, PACK, n)
    packed = torch.zeros((k // PACK, n), dtype=torch.int32, device=q.device)
    for j in range(PACK):
        packed |= v[:, j] << (4 * j)  # bit 31 may be set: int32 wraps, as the kernel expects
    return packed


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """The float32 weight [K, N] the packed one stands for."""
    q = unpack_rows(qweight).float()  # [K, N]
    z = zeros.float() if zeros is not None else torch.full_like(scales, 8.0)
    return (q - z.repeat_interleave(group_size, 0)) * scales.repeat_interleave(group_size, 0)


def w4a16_reference(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch: the weight dequantized and rounded to x's dtype (as the kernel feeds its
    dot), then F.linear."""
    w = dequantize(qweight, scales, zeros, group_size).to(x.dtype)  # [K, N]
    return F.linear(x, w.t(), bias)  # [M, N]
