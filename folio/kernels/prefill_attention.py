"""Prefill attention: a FlashAttention-2 style forward for long prompt chunks over the paged cache.

The unified kernel (paged_attention.py) serves every batch shape with one tile layout and masks
every tile; this kernel is built for the tall query blocks of long prompts:
- A program owns (q block, KV head): BLOCK_Q query tokens of one sequence times the GROUP query
  heads that share the KV head (BLOCK_M = BLOCK_Q * GROUP rows, 128 by default: one wgmma
  warpgroup tile per 4 warps), so each K/V tile is read once per group (GQA).
- Keys of a q block come in two phases. Tiles every row of the block sees in full (all keys at or
  before the block's first query position) run without any mask; only the one or two tiles on the
  diagonal apply the causal mask. Tiles past the block's last query are never visited (causal
  tile skipping).
- Programs take q blocks in reverse order of the flat batch, so the blocks at the end of a long
  prompt (the most keys to read) start first and the short ones fill the tail of the wave.
- K/V are read through the block table (prefill chunks attend to the cached context and to their
  own new tokens, which reshape_and_cache has already stored: one kernel, no merge). Block ids run
  one tile ahead so the K/V loads of tile i+1 never wait on an in-loop load and num_stages can
  pipeline them (cp.async, 16-byte rows).
- Varlen: the grid is num_tokens // BLOCK_Q + num_seqs (an upper bound on the q blocks over all
  sequences, host ints only); a program finds its sequence by binary search, as the unified
  kernel does. Sequences with fewer than min_query_len new tokens are skipped (their rows are left
  to another kernel), so a mixed batch can be split between two launches without index tensors.

K/V tiles are loaded in `_load_kv_tile` alone: a quantised cache (k_scale / v_scale) dequantises
there. float32 models keep the unified kernel (exact dot products for the greedy tests).
"""

from __future__ import annotations

import torch

from folio.attention.backends.torch_ref import paged_attention_reference  # noqa: F401  (the reference)
from folio.kernels.paged_attention import (
    LOG2_E,
    TileConfig,
    _find_sequence,
    check_attention_inputs,
    check_output,
)
from folio.kernels.triton_compat import check_same_device, next_power_of_2, tl, triton

_HALF = (torch.float16, torch.bfloat16)


@triton.jit
def _load_kv_tile(k_cache_ptr, v_cache_ptr, kv_row, dims, kv_mask):
    """K and V tiles [TILE_N, DIM_PAD] of the tokens whose cache offsets are kv_row."""
    k = tl.load(k_cache_ptr + kv_row[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_row[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def _attend_tiles(
    acc,
    l_i,
    m_i,
    q,  # [BLOCK_M, DIM_PAD]
    q_pos,  # [BLOCK_M] absolute position of each row's token
    k_cache_ptr,
    v_cache_ptr,
    table,  # this sequence's block table row
    kv_head_offset,
    k_start,
    k_stop,  # keys [k_start, k_stop) in TILE_N steps
    k_hi,  # keys at or past k_hi do not exist
    scale_log2,
    cache_stride_block,
    cache_stride_slot,
    dims,
    dim_valid,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    MASKED: tl.constexpr,  # apply the causal / window / length masks (diagonal tiles)
    SLIDING_WINDOW: tl.constexpr,
):
    offsets = tl.arange(0, TILE_N)
    first = k_start + offsets
    next_block = tl.load(table + first // BLOCK_SIZE, mask=first < k_hi, other=0)
    for start in range(k_start, k_stop, TILE_N):
        k_pos = start + offsets  # [TILE_N]
        block = next_block.to(tl.int64)
        ahead = k_pos + TILE_N
        next_block = tl.load(table + ahead // BLOCK_SIZE, mask=ahead < k_hi, other=0)
        kv_row = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot + kv_head_offset
        if MASKED:
            kv_mask = (k_pos < k_hi)[:, None] & dim_valid[None, :]
        else:
            kv_mask = dim_valid[None, :]
        k, v = _load_kv_tile(k_cache_ptr, v_cache_ptr, kv_row, dims, kv_mask)  # [TILE_N, DIM_PAD] each

        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, TILE_N]
        if MASKED:
            visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos < k_hi)[None, :]
            if SLIDING_WINDOW > 0:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)  # [BLOCK_M]
            # Rows that have seen no key yet keep m = -inf (a 0 there would cap later maxima at
            # 0 and underflow their probabilities); only the exponent's shift is made finite.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
            m_safe = m_new
        p = tl.exp2(s * scale_log2 - m_safe[:, None])  # [BLOCK_M, TILE_N]
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["num_seqs", "num_q_blocks", "min_query_len"])
def _prefill_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    query_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    num_seqs,
    num_q_blocks,  # grid size along axis 0
    min_query_len,  # sequences with fewer new tokens are skipped
    scale_log2,  # softmax scale * log2(e)
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    bt_stride,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
):
    q_block = num_q_blocks - 1 - tl.program_id(0)  # last blocks (most keys) first
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len or q_len < min_query_len:
        return
    context_len = tl.load(seq_lens_ptr + seq) - q_len

    rows = tl.arange(0, BLOCK_M)
    tok = local_block * BLOCK_Q + rows // GROUP  # [BLOCK_M] query token within the sequence
    head = kv_head * GROUP + rows % GROUP  # [BLOCK_M] query head
    row_valid = (rows < BLOCK_Q * GROUP) & (tok < q_len)  # [BLOCK_M]
    dims = tl.arange(0, DIM_PAD)
    dim_valid = dims < HEAD_DIM  # [DIM_PAD]
    q_row = (q_start + tok).to(tl.int64)
    q = tl.load(
        query_ptr + q_row[:, None] * q_stride_t + head[:, None] * q_stride_h + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )  # [BLOCK_M, DIM_PAD]
    q_pos = context_len + tok  # [BLOCK_M]

    first_q = context_len + local_block * BLOCK_Q  # the block's first query position
    k_hi = context_len + tl.minimum(local_block * BLOCK_Q + BLOCK_Q, q_len)  # keys [0, k_hi) exist
    k_full = ((first_q + 1) // TILE_N) * TILE_N  # tiles below this are seen in full by every row
    k_lo = 0
    if SLIDING_WINDOW > 0:  # every tile may be cut by the window: all go through the masked phase
        k_lo = (tl.maximum(first_q - SLIDING_WINDOW + 1, 0) // TILE_N) * TILE_N
        k_full = k_lo

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * bt_stride
    kv_head_offset = kv_head * cache_stride_head
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, table, kv_head_offset, k_lo, k_full, k_hi,
        scale_log2, cache_stride_block, cache_stride_slot, dims, dim_valid,
        BLOCK_SIZE, TILE_N, False, SLIDING_WINDOW,
    )
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, table, kv_head_offset, k_full, k_hi, k_hi,
        scale_log2, cache_stride_block, cache_stride_slot, dims, dim_valid,
        BLOCK_SIZE, TILE_N, True, SLIDING_WINDOW,
    )

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    result = acc / l_safe[:, None]  # [BLOCK_M, DIM_PAD]
    tl.store(
        out_ptr + q_row[:, None] * o_stride_t + head[:, None] * o_stride_h + dims[None, :],
        result.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )


def default_prefill_config(group: int, dim_pad: int) -> TileConfig:
    """128-row q tiles (two wgmma warpgroups of 8 warps), 64-key tiles, K/V triple-buffered:
    96 KiB of K/V stages + 32 KiB of q at head_dim 128. Swept in folio.kernels.benchmark."""
    block_m = max(128, next_power_of_2(group))
    tile_n = 32 if dim_pad > 128 else 64
    return TileConfig(block_m, tile_n, num_warps=8, num_stages=3)


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], bf16 or fp16
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor,  # [>= num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [>= num_seqs] int32
    block_tables: torch.Tensor,  # [>= num_seqs, max_blocks_per_seq] int32
    num_seqs: int,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
    config: TileConfig | None = None,
    min_query_len: int = 0,
) -> torch.Tensor:
    """Causal paged attention of the sequences with >= min_query_len new tokens.

    Rows of other sequences, and rows owned by no sequence, are left untouched in out.
    """
    check_attention_inputs(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, sliding_window)
    if query.dtype not in _HALF:
        raise ValueError(f"prefill_attention takes bf16 or fp16 (float32 uses unified_attention), got {query.dtype}.")
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    check_same_device(
        _prefill_attention_kernel,
        query=query,
        kv_cache=kv_cache,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        out=out,
    )
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    dim_pad = max(16, next_power_of_2(head_dim))
    config = config or default_prefill_config(group, dim_pad)
    config.check(next_power_of_2(group))
    block_q = config.block_m // group
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, kv_heads, dim] each
    num_q_blocks = num_tokens // block_q + num_seqs
    _prefill_attention_kernel[(num_q_blocks, num_kv_heads)](
        out,
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        num_seqs,
        num_q_blocks,
        min_query_len,
        scale * LOG2_E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_M=config.block_m,
        TILE_N=config.tile_n,
        SLIDING_WINDOW=sliding_window or 0,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


__all__ = ["prefill_attention", "default_prefill_config", "paged_attention_reference"]
