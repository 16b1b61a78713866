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
_sum_splits_kernel adds up and casts in one pass. One token (M = 1) takes a GEMV kernel
without tl.dot (which would pad it to 16 rows), with wide tiles. Large M dequantizes once and
calls cuBLAS (M >= DEQUANT_MIN_M).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from folio.kernels.triton_compat import check_same_device, tl, triton, use_triton_for

PACK = 8  # int4 values per int32
# From this many tokens on, dequantize + cuBLAS beats the fused kernel (to be measured on H100).
DEQUANT_MIN_M = 256
# Unpack through exponent bits (_nibbles_to_float); FOLIO_W4A16_MAGIC=0 converts (the A/B switch).
MAGIC_DEFAULT = int(os.environ.get("FOLIO_W4A16_MAGIC", "1") != "0")
# The GEMV's K loop on [K/8, N] tiles with one sum at the end (_gemv_flat_step); FOLIO_W4A16_FLAT=0: 3-D tiles.
FLAT_DEFAULT = int(os.environ.get("FOLIO_W4A16_FLAT", "1") != "0")


@triton.jit
def _group_scale_zero(s_ptr, z_ptr, group, stride_sg, rn, n_ok, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Scale and zero point [BLOCK_N] float32 of one quantization group (BLOCK_K divides GROUP,
    so each K step reads one group's row); zero 8 when the format has none (symmetric)."""
    s = tl.load(s_ptr + group * stride_sg + rn, mask=n_ok, other=0.0)
    if HAS_ZEROS:
        z = tl.load(z_ptr + group * stride_sg + rn, mask=n_ok, other=0).to(tl.float32)
    else:
        z = tl.full((BLOCK_N,), 8.0, tl.float32)
    return s, z


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


@triton.jit
def _gemv_flat_step(a_ptr, qw_ptr, s_ptr, z_ptr, k0, k_end, stride_ak, stride_qk, stride_sg, rn, n_ok,
                    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_K / 8, BLOCK_N] float32: word row i's sum over its 8 nibbles of a_k (q_kn - z_n) s_n
    for K rows k0 .. k0 + BLOCK_K (one quantization group), in the words' own layout.

    Three instructions per weight: a shift puts nibble j at mantissa bits 19..22, one LOP3 masks
    it and ORs in the exponent of 1.0 (0x3F800000), so the bits read as f = 1 + q/16 exactly, and
    an FMA adds a_k f. Per word row, sum_j a_j (q_j - z) = 16 sum_j a_j f_j - (16 + z) sum_j a_j:
    the zero point and the 1.0 come out once per row and column, not per weight."""
    rk8 = tl.arange(0, BLOCK_K // 8)
    rows_ok = k0 + rk8 * 8 < k_end
    packed = tl.load(qw_ptr + (k0 // 8 + rk8)[:, None] * stride_qk + rn[None, :],
                     mask=rows_ok[:, None] & n_ok[None, :], other=0)  # [BLOCK_K / 8, BLOCK_N] int32
    bits = packed.to(tl.uint32, bitcast=True)  # logical shifts
    s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok, HAS_ZEROS, BLOCK_N)
    part = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)  # sum_j a_j f_j
    a_sum = tl.zeros((BLOCK_K // 8,), dtype=tl.float32)  # sum_j a_j
    for j in tl.static_range(8):  # nibble j of word i is input row k0 + 8i + j
        k = k0 + rk8 * 8 + j
        a = tl.load(a_ptr + k * stride_ak, mask=k < k_end, other=0.0).to(tl.float32)  # [BLOCK_K / 8]
        if 4 * j <= 19:
            moved = bits << (19 - 4 * j)
        else:
            moved = bits >> (4 * j - 19)
        f = ((moved & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + q / 16
        part += f * a[:, None]
        a_sum += a
    return (16.0 * part - (16.0 + z)[None, :] * a_sum[:, None]) * s[None, :]


@triton.jit
def _gemv_tile_step(a_ptr, qw_ptr, s_ptr, z_ptr, k0, k_end, stride_ak, stride_qk, stride_sg, rn, n_ok,
                    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    MAGIC: tl.constexpr):
    """[BLOCK_N] float32: the step's sum over K rows k0 .. k0 + BLOCK_K on a [K/8, 8, N] tile."""
    rk8 = tl.arange(0, BLOCK_K // 8)
    nib = tl.arange(0, 8)
    shifts = nib * 4  # nibble j of word i is input row 8i + j
    ks = k0 + rk8[:, None] * 8 + nib[None, :]  # [BLOCK_K / 8, 8]
    a = tl.load(a_ptr + ks * stride_ak, mask=ks < k_end, other=0.0).to(tl.float32)  # [BLOCK_K / 8, 8]
    packed = tl.load(
        qw_ptr + (k0 // 8 + rk8)[:, None] * stride_qk + rn[None, :],
        mask=(k0 + rk8 * 8 < k_end)[:, None] & n_ok[None, :],
        other=0,
    )  # [BLOCK_K / 8, BLOCK_N] int32
    nibbles = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [BLOCK_K / 8, 8, BLOCK_N]
    s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok, HAS_ZEROS, BLOCK_N)
    if MAGIC:  # 2^23 + q from the exponent bits, minus 2^23 + z: q - z, exact, in one float add
        w = (nibbles | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + z)[None, None, :]
        step = s * tl.sum(tl.sum(w * a[:, :, None], axis=1), axis=0)
    else:
        dot = tl.sum(tl.sum(nibbles.to(tl.float32) * a[:, :, None], axis=1), axis=0)  # [BLOCK_N]
        step = s * (dot - z * tl.sum(tl.sum(a, axis=1), axis=0))
    return step


@triton.jit
def _w4a16_gemv_kernel(
    a_ptr,  # [1, K] fp16/bf16/fp32
    qw_ptr,  # [K / 8, N] int32
    s_ptr,  # [K / G, N] float32
    z_ptr,  # [K / G, N] uint8 (HAS_ZEROS)
    c_ptr,  # [SPLIT_K, 1, N]: float32 partials, or the output dtype when SPLIT_K == 1
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_ak,
    stride_qk,
    stride_sg,
    stride_cs,
    out_ptr,  # [1, N] the output dtype (REDUCE only)
    counter_ptr,  # [cdiv(N, BLOCK_N)] int32, zero between calls (REDUCE only)
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    REDUCE: tl.constexpr,
    MAGIC: tl.constexpr,
    FLAT: tl.constexpr,
):
    """One token (M = 1, batch-1 decode): no tl.dot (it pads M to 16), the dot product of the
    activation row with each unpacked column summed in float32 registers; the zero point comes
    out of the sum (sum_k a_k (q_kn - z_n) s_n = s_n (sum_k a_k q_kn - z_n sum_k a_k)).
    FLAT: no [K/8, 8, N] tensor and no reduction inside the K loop: nibble j of every word is
    one [K/8, N] step (static_range), multiplied by its own activation rows and accumulated
    element-wise, each element in one thread; the one sum over K/8 comes after the loop. (The
    3-D tile's per-step sums over rows that live in other threads, and its broadcast of the
    words along the nibble axis, are the suspects for the GEMV's 1.1 TB/s: session 7.)
    REDUCE: the last of a column tile's SPLIT_K programs to finish (a counter per tile, taken
    with acq_rel after a barrier) adds the tile's partials in split order and writes the output,
    then zeroes the counter: one launch per GEMM instead of two."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_rows = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)  # FLAT: summed over rows at the end
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        if FLAT:
            acc_rows += _gemv_flat_step(a_ptr, qw_ptr, s_ptr, z_ptr, k0, k_end, stride_ak, stride_qk, stride_sg,
                                        rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K)
        else:
            acc += _gemv_tile_step(a_ptr, qw_ptr, s_ptr, z_ptr, k0, k_end, stride_ak, stride_qk, stride_sg,
                                   rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, MAGIC)
    if FLAT:
        acc = tl.sum(acc_rows, axis=0)  # [BLOCK_N]
    tl.store(c_ptr + pid_k * stride_cs + rn, acc.to(c_ptr.dtype.element_ty), mask=n_ok)
    if REDUCE:
        tl.debug_barrier()  # every thread's partial is stored before the counter moves
        if tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for split in range(SPLIT_K):  # split order, whatever order the programs ended in
                total += tl.load(c_ptr + split * stride_cs + rn, mask=n_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rn, total.to(out_ptr.dtype.element_ty), mask=n_ok)
            tl.atomic_xchg(counter_ptr + pid_n, 0)


@triton.jit
def _sum_splits_kernel(
    part_ptr,  # [SPLIT_K, M * N] float32
    out_ptr,  # [M * N] the output dtype
    total,  # M * N
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out = sum over splits of the partials, cast once: one pass instead of torch's sum and cast."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    ptrs = part_ptr + offs  # int64 offsets; stepped by total, never multiplied (no int32 overflow)
    for _ in range(SPLIT_K):
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += total
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


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


def gemv_split_k(n: int, k: int, block_n: int, block_k: int, num_sms: int) -> int:
    """The GEMV's split of K: doubled until about four programs per SM, keeping >= 2 K steps each."""
    tiles, split_k = triton.cdiv(n, block_n), 1
    while tiles * split_k < 4 * num_sms and k // (block_k * split_k * 2) >= 2:
        split_k *= 2
    return split_k


def pick_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> dict[str, int]:
    """Tile sizes and split-K: small M splits K until about two programs per SM; one token
    takes the GEMV kernel (GEMV=1) with wide tiles, split until about four programs per SM."""
    if m == 1:
        block_k, block_n = min(128, group_size), 128
        return dict(GEMV=1, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=gemv_split_k(n, k, block_n, block_k, num_sms),
                    num_warps=4)
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
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
    cfg = dict(config or pick_config(m, n, k, group_size, sms))
    gemv = bool(cfg.pop("GEMV", 0))
    reduce_in_kernel = bool(cfg.pop("REDUCE", 0))  # GEMV only: the split-K sum in the same launch
    magic = int(cfg.pop("MAGIC", MAGIC_DEFAULT))  # unpack through exponent bits (_nibbles_to_float); 0: conversions
    flat = int(cfg.pop("FLAT", FLAT_DEFAULT))  # GEMV only: the K loop without 3-D tiles or per-step sums
    if gemv and m != 1:
        raise ValueError(f"w4a16: the GEMV kernel takes one row, got M={m}.")
    split_k = cfg.pop("SPLIT_K")
    num_warps = cfg.pop("num_warps", 4)
    num_stages = cfg.pop("num_stages", None)  # None: Triton's default
    launch = dict(num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}))
    block_k = cfg["BLOCK_K"]
    if group_size % block_k:
        raise ValueError(f"w4a16: BLOCK_K={block_k} must divide the group size {group_size}.")
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
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
            SPLIT_K=split_k, REDUCE=reduce, MAGIC=magic, FLAT=flat, **launch,
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
    result = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block = 1024
    _sum_splits_kernel[(triton.cdiv(m * n, block),)](out, result, m * n, SPLIT_K=split_k, BLOCK=block, num_warps=4)
    return result  # [M, N]


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
