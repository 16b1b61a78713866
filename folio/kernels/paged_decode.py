"""Split-KV paged decode: attention for a batch where every sequence has one new token.

Design:
- Grid (num_seqs, num_kv_heads, num_splits). A program takes one sequence's token, the GROUP
  query heads of one KV head (padded to 16 rows for the tensor cores), and one partition of the
  visible context [kv_lo, seq_len) (kv_lo > 0 only under a sliding window). K/V are streamed
  once per group through the block table in TILE_N-token tiles, as in paged_attention.py. No
  causal mask is needed: the token is the last one of its sequence.
- Grid rows take sequences in `order` when one is given (AttentionMetadata.decode_order, longest
  context first): the hardware starts programs in grid order, so a long sequence started last runs
  on alone at the end of the launch (1-2% of a 96-256 sequence launch, session 22).
- With num_splits == 1 the program normalises and writes the output row itself. Otherwise each
  split writes its unnormalised float32 accumulator and (running max in log2 units, running sum);
  _merge_splits_kernel combines them by log-sum-exp.
- The split size is computed on the device per sequence: cdiv(visible, num_splits) rounded up to
  TILE_N, but at least min_split_tokens, so a short sequence uses fewer splits than launched and
  the surplus programs exit at once. The grid thus depends only on the batch size and the chosen
  split count, never on the lengths: valid under CUDA graph capture for any context length.

Heuristic (choose_num_splits): split only when num_seqs * num_kv_heads programs cannot give every
SM four; then take the smallest power of two that does, at most 32. Each program keeps two 32 KiB
K/V tiles in flight and 3 fit per SM, so 4 per SM leaves a wave's worth of programs queued to
even out unequal lengths (docs/perf-notes.md). W1 at 256 sequences x 8 KV heads = 2048 programs
never splits; below 66 sequences (the run's tail) it does.
"""

import os

import torch

from folio.kernels.paged_attention import LOG2_E, TileConfig, check_attention_inputs, check_output, dot_precision
from folio.kernels.triton_compat import (
    check_same_device,
    next_power_of_2,
    pdl_launch,
    pdl_wait,
    tl,
    triton,
)

MAX_SPLITS = 32
PROGRAMS_PER_SM = 4  # decode programs wanted per SM in the grid (see choose_num_splits)
# A split must read more K/V (32 KiB per KV head at 64 tokens) than it writes (2 KiB); 64, not
# 256, measured (session 8, H100, batch-1 decode): 8B 6.32 -> 6.19 ms, 0.6B 1.37 -> 1.29 ms (32:
# 6.23 / 1.33). FOLIO_DECODE_MIN_SPLIT_TOKENS changes it (the A/B switch).
MIN_SPLIT_TOKENS = int(os.environ.get("FOLIO_DECODE_MIN_SPLIT_TOKENS", "64"))
# An FP8 (e4m3) cache on CUDA attended in float16: its bytes widened in registers (_e4m3_to_f16;
# -> bf16 would take a second conversion per element), q pre-scaled into log2 units so it stays
# far from f16's range limits. FOLIO_DECODE_FP8_F16=0: Triton widens to the query dtype (A/B).
FP8_AS_F16 = os.environ.get("FOLIO_DECODE_FP8_F16", "1") != "0"


@triton.jit
def _split_size(kv_lo, seq_len, NUM_SPLITS: tl.constexpr, TILE_N: tl.constexpr, min_split_tokens):
    """Tokens per split for one sequence, and how many splits it uses (shared by both kernels)."""
    visible = seq_len - kv_lo
    per_split = tl.cdiv(tl.cdiv(visible, NUM_SPLITS), TILE_N) * TILE_N
    per_split = tl.maximum(per_split, min_split_tokens)
    return per_split, tl.cdiv(visible, per_split)


@triton.jit
def _e4m3_to_f16(raw):
    """e4m3 bytes (uint8) to float16, exactly, in registers: PTX's paired conversion on four
    bytes at a time. Loading bytes and widening them here keeps the FP8 tile out of the dot
    operand path, where Triton reads it back from shared memory one byte at a time (LDS.U8)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [raw], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]  (NUM_SPLITS == 1)
    part_out_ptr,  # [num_seqs, num_heads, NUM_SPLITS, DIM_PAD] float32  (NUM_SPLITS > 1)
    part_m_ptr,  # [num_seqs, num_heads, NUM_SPLITS] float32, running max * log2(e)
    part_l_ptr,  # [num_seqs, num_heads, NUM_SPLITS] float32, running sum
    query_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    order_ptr,  # [num_seqs] int32 (ORDERED): the sequence each grid row takes, longest first
    scale_log2,  # softmax scale * log2(e) * k_scale (an FP8 cache stores K / k_scale)
    v_scale,  # an FP8 cache stores V / v_scale; 1.0 otherwise
    min_split_tokens,
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    bt_stride,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # next power of two >= max(GROUP, 16)
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (triton_compat.pdl_launch)
    F16_MATH: tl.constexpr,  # an FP8 cache on CUDA: bytes widened in registers, dots in float16 (FP8_AS_F16)
    ORDERED: tl.constexpr,  # grid rows map to sequences through order_ptr
):
    pdl_wait(PDL)
    seq = tl.program_id(0)
    if ORDERED:
        seq = tl.load(order_ptr + seq)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    if (q_len == 0) | (seq_len == 0):
        return  # a padding sequence
    kv_lo = 0
    if SLIDING_WINDOW > 0:
        kv_lo = tl.maximum(seq_len - SLIDING_WINDOW, 0)
    per_split, _ = _split_size(kv_lo, seq_len, NUM_SPLITS, TILE_N, min_split_tokens)
    start = kv_lo + split * per_split
    if start >= seq_len:
        return  # this sequence needs fewer splits than were launched
    end = tl.minimum(start + per_split, seq_len)

    rows = tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + rows  # [BLOCK_M] query head
    row_valid = rows < GROUP
    dims = tl.arange(0, DIM_PAD)
    dim_valid = dims < HEAD_DIM
    q_row = q_start.to(tl.int64)
    q = tl.load(
        query_ptr + q_row * q_stride_t + head[:, None] * q_stride_h + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )  # [BLOCK_M, DIM_PAD]
    if F16_MATH:  # scores come out in log2 units; |q| * scale_log2 stays well inside f16's range
        q = (q.to(tl.float32) * scale_log2).to(tl.float16)
        score_scale = 1.0
    else:
        score_scale = scale_log2

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * bt_stride
    # Block ids run one tile ahead, so the K/V loads do not wait on an in-loop load and the
    # pipeliner can multi-buffer them (docs/perf-notes.md, compile report).
    first = start + tl.arange(0, TILE_N)
    next_block = tl.load(table + first // BLOCK_SIZE, mask=first < end, other=0)
    for tile in range(start, end, TILE_N):
        k_pos = tile + tl.arange(0, TILE_N)  # [TILE_N]
        k_valid = k_pos < end
        block = next_block.to(tl.int64)
        ahead = k_pos + TILE_N
        next_block = tl.load(table + ahead // BLOCK_SIZE, mask=ahead < end, other=0)
        kv_row = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot + kv_head * cache_stride_head
        kv_mask = k_valid[:, None] & dim_valid[None, :]
        # An FP8 cache widens here (to f16 with F16_MATH, else to the query dtype); its scales are
        # folded into scale_log2 and applied to the output once (a no-op cast for a model-dtype cache).
        if F16_MATH:  # e4m3 bytes widened in registers, four per instruction pair (_e4m3_to_f16)
            k = _e4m3_to_f16(tl.load(k_cache_ptr.to(tl.pointer_type(tl.uint8)) + kv_row[:, None] + dims[None, :],
                                     mask=kv_mask, other=0))
            v = _e4m3_to_f16(tl.load(v_cache_ptr.to(tl.pointer_type(tl.uint8)) + kv_row[:, None] + dims[None, :],
                                     mask=kv_mask, other=0))
        else:
            k = tl.load(k_cache_ptr + kv_row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            v = tl.load(v_cache_ptr + kv_row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * score_scale  # [BLOCK_M, TILE_N]
        s = tl.where(k_valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds >= 1 valid key
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        result = acc * (v_scale / l_i[:, None])  # [BLOCK_M, DIM_PAD]
        tl.store(
            out_ptr + q_row * o_stride_t + head[:, None] * o_stride_h + dims[None, :],
            result.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_valid[None, :],
        )
    else:
        part = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + split  # [BLOCK_M]
        tl.store(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :], acc * v_scale, mask=row_valid[:, None])
        tl.store(part_m_ptr + part, m_i, mask=row_valid)
        tl.store(part_l_ptr + part, l_i, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    part_out_ptr,  # [num_seqs, num_heads, NUM_SPLITS, DIM_PAD] float32
    part_m_ptr,  # [num_seqs, num_heads, NUM_SPLITS] float32
    part_l_ptr,  # [num_seqs, num_heads, NUM_SPLITS] float32
    seq_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    min_split_tokens,
    o_stride_t,
    o_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    if (q_len == 0) | (seq_len == 0):
        return
    kv_lo = 0
    if SLIDING_WINDOW > 0:
        kv_lo = tl.maximum(seq_len - SLIDING_WINDOW, 0)
    _, used = _split_size(kv_lo, seq_len, NUM_SPLITS, TILE_N, min_split_tokens)

    splits = tl.arange(0, NUM_SPLITS)
    active = splits < used  # [NUM_SPLITS]
    part = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + splits  # [NUM_SPLITS]
    m = tl.load(part_m_ptr + part, mask=active, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=active, other=0.0)
    weight = tl.exp2(m - tl.max(m, 0))  # [NUM_SPLITS], 0 for inactive splits
    dims = tl.arange(0, DIM_PAD)
    acc = tl.load(part_out_ptr + part[:, None] * DIM_PAD + dims[None, :], mask=active[:, None], other=0.0)
    result = tl.sum(acc * weight[:, None], 0) / tl.sum(l * weight, 0)  # [DIM_PAD]
    tl.store(
        out_ptr + q_start.to(tl.int64) * o_stride_t + head * o_stride_h + dims,
        result.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def paged_decode(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor,  # [>= num_seqs + 1] int32; each query_len is 1 (0 = padding)
    seq_lens: torch.Tensor,  # [>= num_seqs] int32
    block_tables: torch.Tensor,  # [>= num_seqs, max_blocks_per_seq] int32
    num_seqs: int,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int = 1,
    min_split_tokens: int = MIN_SPLIT_TOKENS,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
    config: TileConfig | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    order: torch.Tensor | None = None,  # [>= num_seqs] int32, a permutation of range(num_seqs)
) -> torch.Tensor:
    """Decode attention, split over the context when num_splits > 1 (a power of two <= 32).
    An FP8 kv_cache holds K / k_scale and V / v_scale.

    order: the sequences in the order their programs start (metadata.decode_order, longest
    context first), so the longest ones do not start last and leave SMs idle at the end of the
    launch; None takes them in batch order. The result is the same either way.

    Only each sequence's row query_start_loc[i] is written; sequences with query_len 0 or
    seq_len 0 are padding and write nothing.
    """
    check_attention_inputs(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, sliding_window)
    if num_splits < 1 or num_splits > MAX_SPLITS or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two in [1, {MAX_SPLITS}], got {num_splits}.")
    if min_split_tokens < 1:
        raise ValueError(f"min_split_tokens must be positive, got {min_split_tokens}.")
    if order is not None and (order.dim() != 1 or order.dtype != torch.int32 or order.shape[0] < num_seqs):
        raise ValueError(f"order must be a 1-D int32 tensor of >= {num_seqs} sequences, got "
                         f"{tuple(order.shape)} {order.dtype}.")
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    device = check_same_device(
        _paged_decode_kernel,
        query=query,
        kv_cache=kv_cache,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        out=out,
        **({"order": order} if order is not None else {}),
    )
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    dim_pad = max(16, next_power_of_2(head_dim))
    config = config or default_decode_config(group, dim_pad, query.dtype)
    config.check(next_power_of_2(group))
    tile_n = config.tile_n
    min_split_tokens = -(-min_split_tokens // tile_n) * tile_n
    if num_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, num_splits, dim_pad, dtype=torch.float32, device=device)
        part_m = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=device)
        part_l = torch.empty_like(part_m)
    else:  # unused by the kernel; any tensor will do as a pointer
        part_out = part_m = part_l = out
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, kv_heads, dim] each
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        out,
        part_out,
        part_m,
        part_l,
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        order if order is not None else seq_lens,  # any int32 tensor as a pointer when unordered
        scale * LOG2_E * k_scale,
        v_scale,
        min_split_tokens,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=config.block_m,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        SLIDING_WINDOW=sliding_window or 0,
        DOT_PRECISION=dot_precision(query.dtype),
        F16_MATH=FP8_AS_F16 and kv_cache.is_cuda and kv_cache.dtype == torch.float8_e4m3fn
        and query.dtype != torch.float32,
        ORDERED=order is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl_launch(query),
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            out,
            part_out,
            part_m,
            part_l,
            seq_lens,
            query_start_loc,
            min_split_tokens,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            TILE_N=tile_n,
            NUM_SPLITS=num_splits,
            SLIDING_WINDOW=sliding_window or 0,
            num_warps=4,
            **pdl_launch(query),
        )
    return out


def default_decode_config(group: int, dim_pad: int, dtype: torch.dtype) -> TileConfig:
    """16 rows (the smallest tensor-core tile) hold a group's heads; 64-key bf16 tiles are 16 KiB
    each of K and V; 3 stages double-buffer them (70 KiB shared memory, 3 programs per H100 SM)."""
    tile_n = 32 if dim_pad > 128 or dtype == torch.float32 else 64
    return TileConfig(max(16, next_power_of_2(group)), tile_n, num_warps=4, num_stages=3)


def choose_num_splits(num_seqs: int, num_kv_heads: int, num_sms: int, max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence for a decode batch: enough programs for four per SM, a power of two.

    Depends only on the batch shape (not on context lengths), so a CUDA graph captured for a
    batch size stays right for every length; short contexts simply use fewer of the splits.
    """
    programs = max(num_seqs * num_kv_heads, 1)
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    return min(next_power_of_2(-(-target // programs)), max_splits)

