"""Unified paged attention: one launch for a flat batch of prefill chunks and decode tokens.

Design (a FlashAttention-2 forward over a paged cache):
- A program owns one (q block, KV head). A q block is BLOCK_Q consecutive query tokens of one
  sequence times the GROUP query heads that share the KV head, flattened to BLOCK_M = BLOCK_Q *
  GROUP rows (rows past that are masked), so each K/V tile is loaded once per group: for GQA the
  query heads of a group ride along in the same tensor-core tile.
- The grid is num_tokens // BLOCK_Q + num_seqs q blocks, an upper bound on the sum over sequences
  of cdiv(query_len, BLOCK_Q); a program finds its sequence by binary search over
  query_start_loc[i] // BLOCK_Q + i and exits when its q block lies past the sequence's queries.
  The grid therefore depends only on host ints (padded token count, num_seqs), never on device
  values: no synchronisation, and valid under CUDA graph capture.
- K/V tiles of TILE_N tokens are gathered through the block table token by token (any block size,
  tiles may straddle blocks); each token's head_dim row is contiguous, so loads are 16-byte wide.
- Softmax is online in float32 in the log2 domain (exp2, scale folded with log2 e). Masks:
  causal against the cached context (query token j of a sequence with context c sits at position
  c + j), an optional sliding window, padded head_dim and padded rows.

Decode-only batches take folio/kernels/paged_decode.py instead (split-KV, no binary search).
"""

from dataclasses import dataclass

import torch

from folio.attention.backends.torch_ref import paged_attention_reference  # noqa: F401  (the reference)
from folio.kernels.reshape_and_cache import FP8_KV_DTYPE
from folio.kernels.triton_compat import check_dtype, check_same_device, next_power_of_2, tl, triton

LOG2_E = 1.4426950408889634
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of an attention kernel; the defaults below are predictions to be tuned."""

    block_m: int  # rows per program (query tokens x heads of a group), power of two >= 16
    tile_n: int  # keys per inner iteration, power of two >= 16
    num_warps: int
    num_stages: int

    def check(self, min_block_m: int) -> None:
        for name, v in (("block_m", self.block_m), ("tile_n", self.tile_n)):
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}.")
        if self.block_m < min_block_m:
            raise ValueError(f"block_m must be >= {min_block_m} (the query heads of one group), got {self.block_m}.")


@triton.jit
def _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence i whose first q block, query_start_loc[i] // BLOCK_Q + i, is <= q_block."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_seqs"])  # changes every step: one compiled variant, not three
def _unified_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    query_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    num_seqs,
    scale_log2,  # softmax scale * log2(e) * k_scale (an FP8 cache stores K / k_scale)
    v_scale,  # an FP8 cache stores V / v_scale; 1.0 otherwise
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    bt_stride,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,  # next power of two >= HEAD_DIM
    BLOCK_SIZE: tl.constexpr,  # tokens per KV cache block
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program, >= BLOCK_Q * GROUP, power of two >= 16
    TILE_N: tl.constexpr,  # keys per inner iteration
    SLIDING_WINDOW: tl.constexpr,  # 0 = off
    DOT_PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

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
    q_pos = context_len + tok  # [BLOCK_M] absolute position of each row's token

    # Keys this q block can see: [k_lo, k_hi).
    k_hi = context_len + tl.minimum(local_block * BLOCK_Q + BLOCK_Q, q_len)
    k_lo = 0
    if SLIDING_WINDOW > 0:
        k_lo = tl.maximum(context_len + local_block * BLOCK_Q - SLIDING_WINDOW + 1, 0)
    k_lo = (k_lo // TILE_N) * TILE_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * bt_stride
    # Block ids run one tile ahead, so the K/V loads do not wait on an in-loop load and the
    # pipeliner can multi-buffer them (docs/perf-notes.md, compile report).
    first = k_lo + tl.arange(0, TILE_N)
    next_block = tl.load(table + first // BLOCK_SIZE, mask=first < k_hi, other=0)
    for start in range(k_lo, k_hi, TILE_N):
        k_pos = start + tl.arange(0, TILE_N)  # [TILE_N]
        k_valid = k_pos < k_hi
        block = next_block.to(tl.int64)
        ahead = k_pos + TILE_N
        next_block = tl.load(table + ahead // BLOCK_SIZE, mask=ahead < k_hi, other=0)
        kv_row = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot + kv_head * cache_stride_head
        kv_mask = k_valid[:, None] & dim_valid[None, :]
        # An FP8 cache widens to the query dtype here; its scales are folded into scale_log2
        # and applied to the output once (a no-op cast for a model-dtype cache).
        k = tl.load(k_cache_ptr + kv_row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + kv_row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [BLOCK_M, TILE_N]
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]
        if SLIDING_WINDOW > 0:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M]
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # [BLOCK_M, TILE_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    result = acc * (v_scale / l_safe[:, None])  # [BLOCK_M, DIM_PAD]
    o_row = (q_start + tok).to(tl.int64)
    tl.store(
        out_ptr + o_row[:, None] * o_stride_t + head[:, None] * o_stride_h + dims[None, :],
        result.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )


def unified_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor,  # [>= num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [>= num_seqs] int32
    block_tables: torch.Tensor,  # [>= num_seqs, max_blocks_per_seq] int32
    num_seqs: int,
    max_query_len: int,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
    config: TileConfig | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal paged attention for a mixed batch; rows outside every sequence are left untouched.
    An FP8 kv_cache holds K / k_scale and V / v_scale.

    max_query_len (a host int) only picks the default tile shape; any value >= 1 is correct.
    """
    check_attention_inputs(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, sliding_window)
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    check_same_device(
        _unified_attention_kernel,
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
    config = config or default_unified_config(group, max(max_query_len, 1), dim_pad, query.dtype)
    config.check(next_power_of_2(group))
    block_q = config.block_m // group
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, kv_heads, dim] each
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _unified_attention_kernel[grid](
        out,
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        num_seqs,
        scale * LOG2_E * k_scale,
        v_scale,
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
        DOT_PRECISION=dot_precision(query.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def default_unified_config(group: int, max_query_len: int, dim_pad: int, dtype: torch.dtype) -> TileConfig:
    """Prefill chunks want tall q tiles (K/V re-read once per BLOCK_Q tokens, 64-row wgmma
    tiles); a batch whose longest query is short wants 16 rows, so decode rows waste little."""
    block_m = 16 if max_query_len * group <= 16 else 64
    block_m = max(block_m, next_power_of_2(group))
    tile_n = 32 if dim_pad > 128 or dtype == torch.float32 else 64
    # Stages chosen from the sm_90 compile report: both shapes then double-buffer K/V.
    stages = 3 if block_m == 16 else 2
    return TileConfig(block_m, tile_n, num_warps=8 if block_m >= 128 else 4, num_stages=stages)


def dot_precision(dtype: torch.dtype) -> str:
    """float32 models get exact float32 dot products (greedy tokens must match the CPU path)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_attention_inputs(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_seqs: int,
    sliding_window: int | None,
) -> None:
    """Shape, dtype and layout checks shared by the unified and the decode launchers (host only)."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim], got {tuple(kv_cache.shape)}.")
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, num_heads, head_dim], got {tuple(query.shape)}.")
    _, num_heads, head_dim = query.shape
    block_size, num_kv_heads, cache_dim = kv_cache.shape[2:]
    if cache_dim != head_dim:
        raise ValueError(f"query head_dim {head_dim} != kv_cache head_dim {cache_dim}.")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}).")
    if head_dim > 256:
        raise ValueError(f"head_dim up to 256 is supported, got {head_dim}.")
    if block_size & (block_size - 1) or not 1 <= block_size <= 256:
        raise ValueError(f"block_size must be a power of two in [1, 256], got {block_size}.")
    check_dtype("query", query, _FLOATS)
    if kv_cache.dtype not in (query.dtype, FP8_KV_DTYPE):
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} is neither the query's ({query.dtype}) nor float8_e4m3fn.")
    if query.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("query and kv_cache must be contiguous in head_dim.")
    for name, t, rank in (("query_start_loc", query_start_loc, 1), ("seq_lens", seq_lens, 1), ("block_tables", block_tables, 2)):
        if t.dim() != rank or t.dtype != torch.int32:
            raise ValueError(f"{name} must be a {rank}-D int32 tensor, got {tuple(t.shape)} {t.dtype}.")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along blocks.")
    if query_start_loc.shape[0] < num_seqs + 1 or seq_lens.shape[0] < num_seqs or block_tables.shape[0] < num_seqs:
        raise ValueError(
            f"num_seqs={num_seqs} but query_start_loc/seq_lens/block_tables have "
            f"{query_start_loc.shape[0]}/{seq_lens.shape[0]}/{block_tables.shape[0]} rows."
        )
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive or None, got {sliding_window}.")


def check_output(out: torch.Tensor, query: torch.Tensor) -> None:
    if out.shape != query.shape or out.dtype != query.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be {tuple(query.shape)} {query.dtype}, contiguous in head_dim.")


__all__ = ["TileConfig", "unified_attention", "paged_attention_reference", "default_unified_config"]
