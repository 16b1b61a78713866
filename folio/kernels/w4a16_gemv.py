"""W4A16 GEMV: one token (M = 1, batch-1 decode) times 4-bit weights, and the helpers the tiled
kernel (folio/kernels/w4a16_gemm.py, which launches both and documents the weight layout) shares.

No tl.dot (it would pad M to 16): the activation row's dot product with each unpacked column
summed in float32 registers, K split over programs until about four per SM (gemv_split_k), the
split-K partials added by a second launch under PDL (split_k_sum.sum_partials, the default since
session 14) or, with REDUCE, by each column tile's last program.
"""

from __future__ import annotations

import os

from folio.kernels.split_k_sum import last_split_sums
from folio.kernels.triton_compat import pdl_wait, tl, triton


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

# _gemv_denormal_step's products are a q 2^(DENORMAL_SHIFT - 149): normal floats for |a q| >= 2^-41
# (4.5e-13), and a 2^(DENORMAL_SHIFT - p) stays finite for |a| < 2^64 (1.8e19).
DENORMAL_SHIFT = tl.constexpr(64)
DENORMAL_UNSCALE = tl.constexpr(2.0 ** (149 - 64))  # 2^(149 - DENORMAL_SHIFT)


@triton.jit
def _denormal_acts(a_ptr, k0, stride_ak, BLOCK_K: tl.constexpr):
    """The 8 activation vectors [BLOCK_K / 8] of a step (a_j: input row k0 + 8i + j of word row i),
    in the input's dtype, from one base pointer per row (j an immediate offset)."""
    rows = a_ptr + (k0 + tl.arange(0, BLOCK_K // 8) * 8) * stride_ak
    return (tl.load(rows), tl.load(rows + stride_ak), tl.load(rows + 2 * stride_ak), tl.load(rows + 3 * stride_ak),
            tl.load(rows + 4 * stride_ak), tl.load(rows + 5 * stride_ak), tl.load(rows + 6 * stride_ak),
            tl.load(rows + 7 * stride_ak))


@triton.jit
def _denormal_products(packed, acts, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """([BLOCK_K / 8, BLOCK_N] float32 2^(S - 149) sum_j a_ij q_ij, [BLOCK_K / 8] sum_j a_ij): a
    step's nibble products per word row, read as denormals (_gemv_denormal_step says how)."""
    bits = packed.to(tl.uint32, bitcast=True)  # [BLOCK_K / 8, BLOCK_N] words of K rows k0 .. k0 + BLOCK_K
    high = bits >> 12  # nibbles 3..7 at bits 0..19
    part = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)  # 2^(S - 149) sum_j a_j q_j
    a_sum = tl.zeros((BLOCK_K // 8,), dtype=tl.float32)
    for j in tl.static_range(8):  # nibble j of word i is input row k0 + 8i + j
        a = acts[j].to(tl.float32)
        a_sum += a
        if j < 5:
            f = (bits & (0xF << (4 * j))).to(tl.float32, bitcast=True)
            b = a * (2.0 ** (DENORMAL_SHIFT - 4 * j))
        else:
            f = (high & (0xF << (4 * j - 12))).to(tl.float32, bitcast=True)
            b = a * (2.0 ** (DENORMAL_SHIFT - 4 * j + 12))
        part += f * b[:, None]
    return part, a_sum


@triton.jit
def _gemv_denormal_step(packed, acts, s, z, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_K / 8, BLOCK_N] float32 like _gemv_flat_step, two instructions per weight: an AND
    keeps nibble j where it lies in the word, and the bits read as a float32 with a zero exponent
    field, a denormal equal to q * 2^(p - 149) exactly (p: the nibble's lowest bit, at most 19, so
    the field stays zero); one FMA multiplies it by a_j 2^(S - p) (S = DENORMAL_SHIFT, the power
    chosen per nibble once per word row, not per weight), so every product is a_j q 2^(S - 149), a
    normal float. Nibbles 5..7 (bits 20..31) are read from the word shifted right by 12 (one shift
    per word). The GPU's FMA takes denormal operands at full rate (Triton does not flush them).
    packed: the step's words; acts: _denormal_acts; s, z: the group's scale and zero point."""
    part, a_sum = _denormal_products(packed, acts, BLOCK_N, BLOCK_K)
    unscale = s * DENORMAL_UNSCALE
    return part * unscale[None, :] - a_sum[:, None] * (z * s)[None, :]


@triton.jit
def _denormal_words(qw_ptr, k0, stride_qk, rn, ok, BLOCK_K: tl.constexpr):
    """[BLOCK_K / 8, BLOCK_N] int32: the words of K rows k0 .. k0 + BLOCK_K (ok: [BLOCK_N] mask)."""
    rk8 = tl.arange(0, BLOCK_K // 8)
    return tl.load(qw_ptr + (k0 // 8 + rk8)[:, None] * stride_qk + rn[None, :], mask=ok[None, :], other=0)


@triton.jit
def _gemv_denormal_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg, rn, n_ok,
                        GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PREFETCH: tl.constexpr, PDL: tl.constexpr):
    """[BLOCK_K / 8, BLOCK_N] float32: the denormal steps over K rows k_start .. k_end. K is a
    multiple of the group (the launcher checks), so of BLOCK_K: no word row is out of range.
    PREFETCH: each step's words are loaded during the step before (one load in flight while the
    FMAs run), not at its start. (Session 8 measured and dropped two more: words two steps ahead,
    and activations and scales one step ahead too: equal or slower.)
    PDL (with PREFETCH): the first step's words, which no kernel writes, are loaded before
    gdc_wait, so under programmatic dependent launch they stream in while the kernel ahead (the
    norm or activation that writes this GEMV's input) still runs."""
    acc_rows = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    if PREFETCH:
        packed = _denormal_words(qw_ptr, k_start, stride_qk, rn, n_ok & (k_start < k_end), BLOCK_K)
        pdl_wait(PDL)
        for k0 in range(k_start, k_end, BLOCK_K):
            k1 = k0 + BLOCK_K
            following = _denormal_words(qw_ptr, k1, stride_qk, rn, n_ok & (k1 < k_end), BLOCK_K)
            s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok, HAS_ZEROS, BLOCK_N)
            acts = _denormal_acts(a_ptr, k0, stride_ak, BLOCK_K)
            acc_rows += _gemv_denormal_step(packed, acts, s, z, BLOCK_N, BLOCK_K)
            packed = following
    else:
        for k0 in range(k_start, k_end, BLOCK_K):
            packed = _denormal_words(qw_ptr, k0, stride_qk, rn, n_ok, BLOCK_K)
            s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok, HAS_ZEROS, BLOCK_N)
            acts = _denormal_acts(a_ptr, k0, stride_ak, BLOCK_K)
            acc_rows += _gemv_denormal_step(packed, acts, s, z, BLOCK_N, BLOCK_K)
    return acc_rows


@triton.jit
def _gemv_columns_step(packed, acts, s, z, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N] float32: _gemv_denormal_step's products summed over the step's word rows as they
    are made, for layouts where one thread holds every row of its columns (BLOCK_N >= 256 x
    num_warps: 8 columns per thread share each activation, where the [4, 1]-warp tiles share it
    among 4). The rows' sum is then register adds fused into the FMAs, and the scale and zero point
    apply once per column and step, not once per row."""
    part, a_sum = _denormal_products(packed, acts, BLOCK_N, BLOCK_K)
    return tl.sum(part, axis=0) * (s * DENORMAL_UNSCALE) - tl.sum(a_sum, axis=0) * (z * s)


@triton.jit
def _columns_words(qw_ptr, k0, stride_qk, rn, n_ok, EVEN_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVICTION: tl.constexpr):
    """[BLOCK_K / 8, BLOCK_N] int32: the words of K rows k0 .. k0 + BLOCK_K (rows in range).
    EVICTION: the loads' L2 policy ("evict_first" by default: a decode reads each weight once per
    token, so they should not push the activations, partials and KV cache out of L2)."""
    ptrs = qw_ptr + (k0 // 8 + tl.arange(0, BLOCK_K // 8))[:, None] * stride_qk + rn[None, :]
    if EVEN_N:
        return tl.load(ptrs, eviction_policy=EVICTION)
    return tl.load(ptrs, mask=n_ok[None, :], other=0, eviction_policy=EVICTION)


@triton.jit
def _gemv_columns_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg, rn, n_ok,
                       GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       EVEN_N: tl.constexpr, PDL: tl.constexpr, EVICTION: tl.constexpr):
    """[BLOCK_N] float32: _gemv_denormal_loop (words one step ahead, the first before gdc_wait)
    with _gemv_columns_step (session 12: two steps ahead measured slower, 3.12 vs 3.00 ms per
    INT4 token). A split holds at least one step (the launcher drops empty ones), so
    the prefetch after the last step can re-read that step's rows (an L2 hit) instead of masking;
    with EVEN_N (N a multiple of BLOCK_N) the word loads take no mask at all."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    last = k_end - BLOCK_K  # loads past the split re-read its last step (an L2 hit): no mask
    packed = _columns_words(qw_ptr, k_start, stride_qk, rn, n_ok, EVEN_N, BLOCK_K, EVICTION)
    pdl_wait(PDL)
    for k0 in range(k_start, k_end, BLOCK_K):
        following = _columns_words(qw_ptr, tl.minimum(k0 + BLOCK_K, last), stride_qk, rn, n_ok, EVEN_N, BLOCK_K,
                                   EVICTION)
        s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok | EVEN_N, HAS_ZEROS, BLOCK_N)
        acts = _denormal_acts(a_ptr, k0, stride_ak, BLOCK_K)
        acc += _gemv_columns_step(packed, acts, s, z, BLOCK_N, BLOCK_K)
        packed = following
    return acc


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
    STEP: tl.constexpr,  # GEMV_STEPS: 0 the 3-D tiles, 1 flat, 2 denormal, 3 columns
    PREFETCH: tl.constexpr,  # STEP 2: each step's words loaded one step ahead
    PDL: tl.constexpr,  # launched with programmatic dependent launch (triton_compat.pdl_launch)
    EVEN_N: tl.constexpr = False,  # N % BLOCK_N == 0 (STEP 3: word loads without a mask)
    EVICTION: tl.constexpr = "evict_first",  # STEP 3: the words' L2 policy ("" Triton's default)
):
    """One token (M = 1, batch-1 decode): no tl.dot (it pads M to 16), the dot product of the
    activation row with each unpacked column summed in float32 registers; the zero point comes
    out of the sum (sum_k a_k (q_kn - z_n) s_n = s_n (sum_k a_k q_kn - z_n sum_k a_k)).
    STEP 1 (flat) and 2 (denormal): no [K/8, 8, N] tensor and no reduction inside the K loop:
    nibble j of every word is one [K/8, N] step (static_range), multiplied by its own activation
    rows and accumulated element-wise, each element in one thread; the one sum over K/8 comes
    after the loop. Denormal (the default) takes two instructions per weight where flat takes
    three (docs/perf-notes.md, session 8: Nsight Compute found the GEMV issue-bound, ~7 SASS
    instructions per weight in all, not waiting on memory).
    REDUCE: the last of a column tile's SPLIT_K programs to finish (a counter per tile, taken
    with acq_rel after a barrier) adds the tile's partials in split order and writes the output,
    then zeroes the counter: one launch per GEMM instead of two.
    PDL: nothing but weights is read, and nothing written, before gdc_wait (for the denormal step
    with PREFETCH, inside _gemv_denormal_loop after its first words; otherwise here)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_rows = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)  # STEP 1, 2: summed over rows at the end
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if not (STEP == 2 and PREFETCH) and STEP != 3:
        pdl_wait(PDL)
    if STEP == 3:
        acc = _gemv_columns_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg,
                                 rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, EVEN_N, PDL, EVICTION)
    elif STEP == 2:
        acc_rows = _gemv_denormal_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg,
                                       rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, PREFETCH, PDL)
    elif STEP == 1:
        for k0 in range(k_start, k_end, BLOCK_K):
            acc_rows += _gemv_flat_step(a_ptr, qw_ptr, s_ptr, z_ptr, k0, k_end, stride_ak, stride_qk, stride_sg,
                                        rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K)
    else:
        for k0 in range(k_start, k_end, BLOCK_K):
            acc += _gemv_tile_step(a_ptr, qw_ptr, s_ptr, z_ptr, k0, k_end, stride_ak, stride_qk, stride_sg,
                                   rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, MAGIC)
    if STEP == 1 or STEP == 2:
        acc = tl.sum(acc_rows, axis=0)  # [BLOCK_N]
    tl.store(c_ptr + pid_k * stride_cs + rn, acc.to(c_ptr.dtype.element_ty), mask=n_ok)
    if REDUCE:
        last_split_sums(c_ptr, stride_cs, out_ptr, counter_ptr, c_ptr, pid_n, rn, n_ok, False, BLOCK_N, SPLIT_K)


# The GEMV's K-step kernels by name (FOLIO_W4A16_GEMV_STEP picks one; the config key STEP).
GEMV_STEPS = {"tiles": 0, "flat": 1, "denormal": 2, "columns": 3}


def _step_from_env() -> int:
    name = os.environ.get("FOLIO_W4A16_GEMV_STEP", "columns")
    if name not in GEMV_STEPS:
        raise ValueError(f"FOLIO_W4A16_GEMV_STEP={name!r}: expected one of {', '.join(GEMV_STEPS)}.")
    return GEMV_STEPS[name]


STEP_DEFAULT = _step_from_env()


def gemv_split_k(n: int, k: int, block_n: int, block_k: int, num_sms: int, busy: int = 4) -> int:
    """The GEMV's split of K: doubled until about `busy` programs per SM (four of four warps),
    keeping >= 2 K steps each. (Session 9 measured a rule nearest four per SM with <= 16 steps
    each, which halves o's and down's splits: 3.11 vs 3.04 ms per INT4 token, so this one stays.)"""
    tiles, split_k = triton.cdiv(n, block_n), 1
    while tiles * split_k < busy * num_sms and k // (block_k * split_k * 2) >= 2:
        split_k *= 2
    return split_k


def columns_split_k(k: int, block_k: int, min_steps: int = 4) -> int:
    """The columns step's split of K: the largest power of two that leaves every program at least
    `min_steps` K steps (session 12's kernel sweep at the 8B's four shapes: the best split of
    each; fewer steps per program lose to the split-K sum, fewer programs to the DRAM latency)."""
    if min_steps < 1:
        raise ValueError(f"w4a16 GEMV: MIN_STEPS must be at least 1, got {min_steps}.")
    split_k = 1
    while k // (block_k * split_k * 2) >= min_steps:
        split_k *= 2
    return split_k
