"""W4A16 GEMV: one token (M = 1, batch-1 decode) times 4-bit weights, and the helpers the tiled
kernel (folio/kernels/w4a16_gemm.py, which launches both and documents the weight layout) shares.

No tl.dot (it would pad M to 16): the activation row's dot product with each unpacked column
summed in float32 registers. The default K step (since session 15) is the chains step
(_gemv_chains_loop: one FMA chain per column, one-warp programs of 128 columns), K split so each
program walks at least four 32-row steps (columns_split_k); the split-K partials are added by a
second launch under PDL (split_k_sum.sum_partials, the default since session 14) or, with REDUCE,
by each column tile's last program. The columns (3) and denormal (2) steps stay for A/B runs.
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


# _gemv_denormal_step's products are a q 2^(DENORMAL_SHIFT - 149): normal floats for |a q| >= 2^-41
# (4.5e-13), and a 2^(DENORMAL_SHIFT - p) stays finite for |a| < 2^64 (1.8e19).
DENORMAL_SHIFT = tl.constexpr(64)
DENORMAL_UNSCALE = tl.constexpr(2.0 ** (149 - 64))  # 2^(149 - DENORMAL_SHIFT)
# S - p for nibble j (_nibble_denormal): the power of two its activation is scaled by.
NIBBLE_POW = tl.constexpr((64, 60, 56, 52, 48, 56, 52, 48))


@triton.jit
def _nibble_denormal(bits, high, j: tl.constexpr):
    """Nibble j of each word as the denormal float32 q 2^(p - 149), p its lowest bit where it is
    read: nibbles 0..4 in place (`bits`), 5..7 from the word shifted right by 12 (`high`), so p
    stays <= 19 and the exponent field zero. Its activation is scaled by 2^(S - p) (NIBBLE_POW)."""
    if j < 5:
        nibble = bits & (0xF << (4 * j))
    else:
        nibble = high & (0xF << (4 * j - 12))
    return nibble.to(tl.float32, bitcast=True)


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
        part += _nibble_denormal(bits, high, j) * (a * (2.0 ** NIBBLE_POW[j]))[:, None]
    return part, a_sum


@triton.jit
def _gemv_denormal_step(packed, acts, s, z, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_K / 8, BLOCK_N] float32, two instructions per weight: an AND
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
def _act_scaled(a_row, j: tl.constexpr, stride_ak, BF16: tl.constexpr):
    """a_row[j] 2^NIBBLE_POW[j] as a float32 scalar (a_row: the activation pointer of a word row's
    first K row, so j is an immediate offset when the stride is 1). bf16: one integer op, the bf16
    bits moved to the top half and the power added to the exponent field (a 0 or denormal gives a
    float of about 2^(POW - 127), whose products with the nibbles, at most 2^(POW - 127 + p - 149)
    with POW = S - p, round to zero; an inf or NaN gives a finite value here, but the zero-point
    term, summed from the true activations, still carries it to the output)."""
    a = tl.load(a_row + j * stride_ak)
    if BF16:
        bits = a.to(tl.uint16, bitcast=True).to(tl.uint32)
        return ((bits << 16) + (NIBBLE_POW[j] << 23)).to(tl.float32, bitcast=True)
    return a.to(tl.float32) * (2.0 ** NIBBLE_POW[j])


@triton.jit
def _row_acts(a_row, stride_ak, BF16: tl.constexpr):
    """The 8 activations of one word row, each scaled for its nibble's denormal reading."""
    return (_act_scaled(a_row, 0, stride_ak, BF16), _act_scaled(a_row, 1, stride_ak, BF16),
            _act_scaled(a_row, 2, stride_ak, BF16), _act_scaled(a_row, 3, stride_ak, BF16),
            _act_scaled(a_row, 4, stride_ak, BF16), _act_scaled(a_row, 5, stride_ak, BF16),
            _act_scaled(a_row, 6, stride_ak, BF16), _act_scaled(a_row, 7, stride_ak, BF16))


@triton.jit
def _chain_word_row(acc, word, acts):
    """acc [BLOCK_N] + 2^(S - 149) sum_j a_j q_j over the 8 nibbles of one word per column (acts:
    _row_acts), each product one FMA into the column's chain (_gemv_denormal_step's reading)."""
    bits = word.to(tl.uint32, bitcast=True)
    high = bits >> 12  # nibbles 5..7 at bits 8..19
    for j in tl.static_range(8):
        acc += _nibble_denormal(bits, high, j) * acts[j]
    return acc


@triton.jit
def _chain_words(qw_ptr, k0, stride_qk, rn, n_ok, EVEN_N: tl.constexpr, EVICTION: tl.constexpr):
    """The 4 word rows ([BLOCK_N] int32 each) of K rows k0 .. k0 + 32 (rows in range)."""
    base = qw_ptr + (k0 // 8) * stride_qk + rn
    if EVEN_N:
        return (tl.load(base, eviction_policy=EVICTION), tl.load(base + stride_qk, eviction_policy=EVICTION),
                tl.load(base + 2 * stride_qk, eviction_policy=EVICTION),
                tl.load(base + 3 * stride_qk, eviction_policy=EVICTION))
    return (tl.load(base, mask=n_ok, other=0, eviction_policy=EVICTION),
            tl.load(base + stride_qk, mask=n_ok, other=0, eviction_policy=EVICTION),
            tl.load(base + 2 * stride_qk, mask=n_ok, other=0, eviction_policy=EVICTION),
            tl.load(base + 3 * stride_qk, mask=n_ok, other=0, eviction_policy=EVICTION))


@triton.jit
def _chain_step_inputs(a_ptr, s_ptr, z_ptr, k0, stride_ak, stride_sg, rn, n_ok, GROUP: tl.constexpr,
                       HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BF16: tl.constexpr):
    """What a chains step reads besides its words: the 4 word rows' scaled activations
    (_row_acts), the step's activation sum for the zero point (one load per lane and a warp sum,
    not 32 adds per thread), and the group's scale and zero point."""
    a_step = a_ptr + k0 * stride_ak
    acts = (_row_acts(a_step, stride_ak, BF16), _row_acts(a_step + 8 * stride_ak, stride_ak, BF16),
            _row_acts(a_step + 16 * stride_ak, stride_ak, BF16), _row_acts(a_step + 24 * stride_ak, stride_ak, BF16))
    a_sum = tl.sum(tl.load(a_step + tl.arange(0, BLOCK_K) * stride_ak).to(tl.float32), axis=0)
    s, z = _group_scale_zero(s_ptr, z_ptr, k0 // GROUP, stride_sg, rn, n_ok, HAS_ZEROS, BLOCK_N)
    return acts, a_sum, s, z


@triton.jit
def _gemv_chains_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg, rn, n_ok,
                      GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVEN_N: tl.constexpr, PDL: tl.constexpr, EVICTION: tl.constexpr, AHEAD: tl.constexpr):
    """[BLOCK_N] float32: _gemv_columns_loop with fewer instructions a weight (STEP 4, "chains").
    The step's 4 word rows are 4 [BLOCK_N] tensors, so each column's 32 products are one FMA
    chain (no per-row partials to add up); the activations are scalars (every thread loads the
    same address) scaled by one integer op each for bf16 (_act_scaled). Words one step ahead
    (session 15: two steps ahead measured slower); AHEAD: the activations, their sum and the
    scales too, so no load waits inside a step."""
    tl.static_assert(BLOCK_K == 32, "the chains step walks 32 K rows (4 word rows) a step")
    BF16: tl.constexpr = a_ptr.dtype.element_ty == tl.bfloat16
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    last = k_end - BLOCK_K  # loads past the split re-read its last step (an L2 hit): no mask
    w0, w1, w2, w3 = _chain_words(qw_ptr, k_start, stride_qk, rn, n_ok, EVEN_N, EVICTION)
    pdl_wait(PDL)
    if AHEAD:
        acts, a_sum, s, z = _chain_step_inputs(a_ptr, s_ptr, z_ptr, k_start, stride_ak, stride_sg, rn, n_ok | EVEN_N,
                                               GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, BF16)
    for k0 in range(k_start, k_end, BLOCK_K):
        k1 = tl.minimum(k0 + BLOCK_K, last)
        n0, n1, n2, n3 = _chain_words(qw_ptr, k1, stride_qk, rn, n_ok, EVEN_N, EVICTION)
        if AHEAD:
            following = _chain_step_inputs(a_ptr, s_ptr, z_ptr, k1, stride_ak, stride_sg, rn, n_ok | EVEN_N,
                                           GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, BF16)
        else:
            acts, a_sum, s, z = _chain_step_inputs(a_ptr, s_ptr, z_ptr, k0, stride_ak, stride_sg, rn, n_ok | EVEN_N,
                                                   GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, BF16)
        chain = tl.zeros((BLOCK_N,), dtype=tl.float32)
        chain = _chain_word_row(chain, w0, acts[0])
        chain = _chain_word_row(chain, w1, acts[1])
        chain = _chain_word_row(chain, w2, acts[2])
        chain = _chain_word_row(chain, w3, acts[3])
        acc += s * (chain * DENORMAL_UNSCALE - a_sum * z)
        w0, w1, w2, w3 = n0, n1, n2, n3
        if AHEAD:
            acts, a_sum, s, z = following
    return acc


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
    STEP: tl.constexpr,  # GEMV_STEPS: 2 denormal, 3 columns, 4 chains
    PREFETCH: tl.constexpr,  # STEP 2: each step's words loaded one step ahead
    PDL: tl.constexpr,  # launched with programmatic dependent launch (triton_compat.pdl_launch)
    EVEN_N: tl.constexpr = False,  # N % BLOCK_N == 0 (STEP 3: word loads without a mask)
    EVICTION: tl.constexpr = "evict_first",  # STEP 3, 4: the words' L2 policy ("" Triton's default)
    AHEAD: tl.constexpr = 0,  # STEP 4: activations and scales loaded one K step ahead
):
    """One token (M = 1, batch-1 decode): no tl.dot (it pads M to 16), the dot product of the
    activation row with each unpacked column summed in float32 registers; the zero point comes
    out of the sum (sum_k a_k (q_kn - z_n) s_n = s_n (sum_k a_k q_kn - z_n sum_k a_k)).
    STEP 2 (denormal): no [K/8, 8, N] tensor and no reduction inside the K loop: nibble j of
    every word is one [K/8, N] step (static_range), multiplied by its own activation rows and
    accumulated element-wise, each element in one thread; the one sum over K/8 comes after the
    loop (two instructions per weight: _gemv_denormal_step). STEP 3 (columns) and 4 (chains, the
    default since session 15) hold every word row of a column in one thread: _gemv_columns_loop,
    _gemv_chains_loop.
    REDUCE: the last of a column tile's SPLIT_K programs to finish (a counter per tile, taken
    with acq_rel after a barrier) adds the tile's partials in split order and writes the output,
    then zeroes the counter: one launch per GEMM instead of two.
    PDL: nothing but weights is read, and nothing written, before gdc_wait (inside the steps'
    loops after their first words; here for the denormal step without PREFETCH)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_rows = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)  # STEP 2: summed over rows at the end
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if STEP == 2 and not PREFETCH:
        pdl_wait(PDL)
    if STEP == 4:
        acc = _gemv_chains_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg,
                                rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, EVEN_N, PDL, EVICTION, AHEAD)
    elif STEP == 3:
        acc = _gemv_columns_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg,
                                 rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, EVEN_N, PDL, EVICTION)
    elif STEP == 2:
        acc_rows = _gemv_denormal_loop(a_ptr, qw_ptr, s_ptr, z_ptr, k_start, k_end, stride_ak, stride_qk, stride_sg,
                                       rn, n_ok, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K, PREFETCH, PDL)
    if STEP == 2:
        acc = tl.sum(acc_rows, axis=0)  # [BLOCK_N]
    tl.store(c_ptr + pid_k * stride_cs + rn, acc.to(c_ptr.dtype.element_ty), mask=n_ok)
    if REDUCE:
        last_split_sums(c_ptr, stride_cs, out_ptr, counter_ptr, c_ptr, pid_n, rn, n_ok, False, BLOCK_N, SPLIT_K)


# The GEMV's K-step kernels by name (FOLIO_W4A16_GEMV_STEP picks one; the config key STEP).
GEMV_STEPS = {"denormal": 2, "columns": 3, "chains": 4}  # (session 8's "tiles" 0 and "flat" 1: removed, slower)


def _step_from_env() -> int:
    name = os.environ.get("FOLIO_W4A16_GEMV_STEP", "chains")
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
