"""Prefill attention for Hopper in Gluon: the scores of the next K tile run on the tensor cores
while this tile's softmax runs (FlashAttention-3's intra-warpgroup overlap).

The Triton kernel (prefill_attention.py) reaches ~60-64% of the matrix rate on long chunks: its
loop waits on each wgmma at once, so a tile's exponentials and its two matrix products run one
after the other (Triton 3.6 places the wait before the softmax even when the scores are issued a
tile early; docs/perf-notes.md, session 17). Gluon states the waits itself:

- A program owns (q block, KV head) as the Triton kernel does: BLOCK_M = 128 rows of BLOCK_Q
  query tokens x the GROUP heads of one KV head, in two warpgroups (8 warps) of 64 rows. q sits in
  shared memory for the whole loop.
- K/V tiles come through the block table by cp.async into a ring of STAGES buffers, the tile two
  ahead issued at the top of each step (its block ids loaded one step before that).
- Step j: issue S(j+1) = q K(j+1)^T (async); softmax of S(j) (masked only where the tile crosses
  the diagonal or the chunk's end); wait for P(j-1) V(j-1) only; rescale; issue P(j) V(j) (async,
  P from registers); wait for S(j+1) only. So S(j+1) runs under the softmax and P(j) V(j) under the
  next step's loads and softmax.

bf16 / fp16 caches of the query's dtype, head_dim 64 or 128, no sliding window (`supports`); the
backend sends other batches to the Triton kernel. `FOLIO_PREFILL_KERNEL` picks (triton_backend.py).
"""

from __future__ import annotations

import functools

import torch

from folio.kernels.paged_attention import LOG2_E, check_attention_inputs, check_output
from folio.kernels.triton_compat import check_same_device

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAS_GLUON = True
except ImportError:  # a CPU install without Triton, or a Triton without Gluon
    HAS_GLUON = False

BLOCK_M = 128  # rows a program: two warpgroups of 64
TILE_N = 64  # keys a step
STAGES = 4  # K/V buffers in the ring: tiles j - 1 .. j + STAGES - 2 (the newest STAGES - 3 in flight)
NUM_WARPS = 8


@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def supports(query: torch.Tensor, kv_cache: torch.Tensor, sliding_window: int | None) -> bool:
    """Whether this kernel takes the batch: a Hopper GPU, a 16-bit cache of the query's dtype,
    head_dim 64 or 128, a power-of-two group of at most BLOCK_M heads, no sliding window."""
    if not (HAS_GLUON and query.is_cuda):
        return False
    if not _is_hopper(query.device.index if query.device.index is not None else torch.cuda.current_device()):
        return False
    num_heads, head_dim = query.shape[1], query.shape[2]
    group = num_heads // kv_cache.shape[3]
    return (query.dtype in (torch.float16, torch.bfloat16) and kv_cache.dtype == query.dtype
            and head_dim in (64, 128) and group & (group - 1) == 0 and group <= BLOCK_M and not sliding_window)


if HAS_GLUON:

    @gluon.jit
    def _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: gl.constexpr):
        """The last sequence i whose first q block, query_start_loc[i] // BLOCK_Q + i, is <= q_block
        (paged_attention._find_sequence's search)."""
        lo = q_block * 0
        hi = num_seqs + lo
        while lo < hi:
            mid = (lo + hi) // 2
            first_block = gl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
            if first_block <= q_block:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    @gluon.jit
    def _issue_tile(k_bufs, v_bufs, stage, k_cache_ptr, v_cache_ptr, ids, k_pos, k_hi, dims, kv_head_offset,
                    cache_stride_block, cache_stride_slot, BLOCK_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr):
        """cp.async of the K and V rows at k_pos (blocks ids) into ring stage `stage`, one commit
        group; keys at or past k_hi are zero-filled."""
        rows = ids.to(gl.int64) * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot + kv_head_offset
        offsets = rows[:, None] + dims[None, :]
        mask = (k_pos < k_hi)[:, None] & (dims < HEAD_DIM)[None, :]
        async_copy.async_copy_global_to_shared(k_bufs.index(stage), k_cache_ptr + offsets, mask)
        async_copy.async_copy_global_to_shared(v_bufs.index(stage), v_cache_ptr + offsets, mask)
        async_copy.commit_group()

    @gluon.jit
    def _tile_ids(table, k_pos, k_hi, BLOCK_SIZE: gl.constexpr):
        return gl.load(table + k_pos // BLOCK_SIZE, mask=k_pos < k_hi, other=0)

    @gluon.jit
    def _softmax_step(s, start, first_q, q_pos, k_hi, m_i, l_i, scale_log2, MASKED: gl.constexpr,
                      TILE_N: gl.constexpr, s_cols: gl.constexpr):
        """(p, alpha, m, l) of the scores s of keys start .. start + TILE_N, m and l in log2 units;
        MASKED: the causal and length masks (a tile past the chunk's end gives p = 0, alpha = 1)."""
        if MASKED:
            k_pos = start + gl.arange(0, TILE_N, layout=s_cols)
            visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos < k_hi)[None, :]
            s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2)  # finite: key 0 is in every row's first tile
        p = gl.exp2(s * scale_log2 - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)

    @gluon.jit
    def _step(j, acc, p, alpha, m_i, l_i, next_ids, q_smem, k_bufs, v_bufs, k_cache_ptr, v_cache_ptr, table, keys, k_hi,
              dims, kv_head_offset, cache_stride_block, cache_stride_slot, first_q, q_pos, scale_log2, zeros_s,
              MASKED: gl.constexpr, BLOCK_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr, TILE_N: gl.constexpr,
              STAGES: gl.constexpr, o_rows: gl.constexpr, s_cols: gl.constexpr, p_layout: gl.constexpr):
        """Step j: P(j) V(j) into acc, with S(j + 1) = q K(j + 1)^T under the rescale and tile j + 1's
        softmax (MASKED or not) under P(j) V(j); tile j + STAGES - 2's copies issued first."""
        async_copy.wait_group(STAGES - 4)  # tile j + 1 landed
        gl.thread_barrier()  # every warp's copies visible; every warp done with step j - 1
        fence_async_shared()
        t_new = j + STAGES - 2  # into the stage of tile j - 2, whose P V step j - 1 waited for
        _issue_tile(k_bufs, v_bufs, t_new % STAGES, k_cache_ptr, v_cache_ptr, next_ids, t_new * TILE_N + keys,
                    k_hi, dims, kv_head_offset, cache_stride_block, cache_stride_slot, BLOCK_SIZE, HEAD_DIM)
        next_ids = _tile_ids(table, (t_new + 1) * TILE_N + keys, k_hi, BLOCK_SIZE)
        s_next = warpgroup_mma(q_smem, k_bufs.index((j + 1) % STAGES).permute((1, 0)), zeros_s, use_acc=False,
                               is_async=True)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
        pv = warpgroup_mma(p_op, v_bufs.index(j % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_next,))  # S(j + 1) done; P(j) V(j) runs on
        p, alpha, m_i, l_i = _softmax_step(s, (j + 1) * TILE_N, first_q, q_pos, k_hi, m_i, l_i, scale_log2, MASKED,
                                           TILE_N, s_cols)
        acc = warpgroup_mma_wait(0, deps=(pv,))
        return acc, p, alpha, m_i, l_i, next_ids

    @gluon.jit(do_not_specialize=["num_seqs", "num_q_blocks", "min_query_len"])
    def _hopper_prefill_kernel(
        out_ptr,  # [num_tokens, num_heads, head_dim]
        query_ptr,  # [num_tokens, num_heads, head_dim]
        k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache_ptr,
        block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
        seq_lens_ptr,  # [num_seqs] int32
        query_start_loc_ptr,  # [num_seqs + 1] int32
        num_seqs,
        num_q_blocks,
        min_query_len,
        scale_log2,
        q_stride_t,
        q_stride_h,
        o_stride_t,
        o_stride_h,
        bt_stride,
        cache_stride_block,
        cache_stride_slot,
        cache_stride_head,
        GROUP: gl.constexpr,
        HEAD_DIM: gl.constexpr,
        BLOCK_SIZE: gl.constexpr,
        BLOCK_Q: gl.constexpr,
        BLOCK_M: gl.constexpr,
        TILE_N: gl.constexpr,
        STAGES: gl.constexpr,
        Q_SMEM: gl.constexpr,  # NVMMASharedLayout of q [BLOCK_M, HEAD_DIM]
        KV_SMEM: gl.constexpr,  # NVMMASharedLayout of a K or V tile [TILE_N, HEAD_DIM]
    ):
        gl.static_assert(STAGES >= 4, "the ring holds tiles j - 1 .. j + 2")
        dtype: gl.constexpr = query_ptr.dtype.element_ty
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, TILE_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [8, 1], [1, 0])
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)
        l_rows: gl.constexpr = gl.SliceLayout(1, load_layout)
        l_cols: gl.constexpr = gl.SliceLayout(0, load_layout)

        q_block = num_q_blocks - 1 - gl.program_id(0)  # last blocks (most keys) first
        kv_head = gl.program_id(1)
        seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
        q_start = gl.load(query_start_loc_ptr + seq)
        q_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
        local_block = q_block - (q_start // BLOCK_Q + seq)
        if local_block * BLOCK_Q >= q_len or q_len < min_query_len:
            return
        context_len = gl.load(seq_lens_ptr + seq) - q_len
        first_q = context_len + local_block * BLOCK_Q  # the block's first query position
        k_hi = context_len + gl.minimum(local_block * BLOCK_Q + BLOCK_Q, q_len)  # keys [0, k_hi) exist
        table = block_tables_ptr + seq.to(gl.int64) * bt_stride
        kv_head_offset = kv_head * cache_stride_head

        # q: gathered once (rows are token x head of the group), kept in shared memory.
        rows = gl.arange(0, BLOCK_M, layout=l_rows)
        dims = gl.arange(0, HEAD_DIM, layout=l_cols)
        tok = local_block * BLOCK_Q + rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        q_ptrs = query_ptr + (q_start + tok).to(gl.int64)[:, None] * q_stride_t + head[:, None] * q_stride_h + dims[None, :]
        q = gl.load(q_ptrs, mask=(tok < q_len)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM, q)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, TILE_N, HEAD_DIM], KV_SMEM)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, TILE_N, HEAD_DIM], KV_SMEM)

        # Tiles 0 .. STAGES - 3 in flight, one commit group each.
        keys = gl.arange(0, TILE_N, layout=l_rows)
        for t in gl.static_range(STAGES - 2):
            k_pos = t * TILE_N + keys
            _issue_tile(k_bufs, v_bufs, t, k_cache_ptr, v_cache_ptr, _tile_ids(table, k_pos, k_hi, BLOCK_SIZE), k_pos,
                        k_hi, dims, kv_head_offset, cache_stride_block, cache_stride_slot, BLOCK_SIZE, HEAD_DIM)
        next_ids = _tile_ids(table, (STAGES - 2) * TILE_N + keys, k_hi, BLOCK_SIZE)
        async_copy.wait_group(STAGES - 3)  # tile 0 landed
        gl.thread_barrier()
        fence_async_shared()

        zeros_s = gl.zeros([BLOCK_M, TILE_N], gl.float32, s_layout)
        s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zeros_s, use_acc=False)
        q_pos = first_q + gl.arange(0, BLOCK_M, layout=s_rows) // GROUP
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
        p, alpha, m_i, l_i = _softmax_step(s, 0, first_q, q_pos, k_hi, m_i, gl.zeros([BLOCK_M], gl.float32, s_rows),
                                           scale_log2, True, TILE_N, s_cols)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        # Step j computes tile j + 1's softmax: masked from the first tile that crosses the diagonal
        # (two loops, so no branch sits between a wgmma and its wait: ptxas waits for every wgmma
        # where control flow joins).
        n_tiles = gl.cdiv(k_hi, TILE_N)
        n_open = gl.maximum(((first_q + 1) // TILE_N) - 1, 0)  # steps whose next tile every row sees in full
        for j in range(0, n_open):
            acc, p, alpha, m_i, l_i, next_ids = _step(
                j, acc, p, alpha, m_i, l_i, next_ids, q_smem, k_bufs, v_bufs, k_cache_ptr, v_cache_ptr, table, keys,
                k_hi, dims, kv_head_offset, cache_stride_block, cache_stride_slot, first_q, q_pos, scale_log2, zeros_s,
                False, BLOCK_SIZE, HEAD_DIM, TILE_N, STAGES, o_rows, s_cols, p_layout)
        for j in range(n_open, n_tiles):
            acc, p, alpha, m_i, l_i, next_ids = _step(
                j, acc, p, alpha, m_i, l_i, next_ids, q_smem, k_bufs, v_bufs, k_cache_ptr, v_cache_ptr, table, keys,
                k_hi, dims, kv_head_offset, cache_stride_block, cache_stride_slot, first_q, q_pos, scale_log2, zeros_s,
                True, BLOCK_SIZE, HEAD_DIM, TILE_N, STAGES, o_rows, s_cols, p_layout)
        async_copy.wait_group(0)

        out = acc / gl.convert_layout(l_i, o_rows)[:, None]
        rows_o = gl.arange(0, BLOCK_M, layout=o_rows)
        dims_o = gl.arange(0, HEAD_DIM, layout=o_cols)
        tok_o = local_block * BLOCK_Q + rows_o // GROUP
        head_o = kv_head * GROUP + rows_o % GROUP
        o_ptrs = out_ptr + (q_start + tok_o).to(gl.int64)[:, None] * o_stride_t + head_o[:, None] * o_stride_h + dims_o[None, :]
        gl.store(o_ptrs, out.to(dtype), mask=(tok_o < q_len)[:, None] & (dims_o < HEAD_DIM)[None, :])


def hopper_prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], bf16 or fp16
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], query's dtype
    query_start_loc: torch.Tensor,  # [>= num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [>= num_seqs] int32
    block_tables: torch.Tensor,  # [>= num_seqs, max_blocks_per_seq] int32
    num_seqs: int,
    scale: float,
    out: torch.Tensor | None = None,
    min_query_len: int = 0,
    stages: int = STAGES,
) -> torch.Tensor:
    """Causal paged attention of the sequences with >= min_query_len new tokens (prefill_attention's
    contract, no sliding window); rows of other sequences are left untouched in out."""
    check_attention_inputs(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, None)
    if not supports(query, kv_cache, None):
        raise ValueError(f"hopper_prefill_attention: unsupported batch (dtype {query.dtype}, cache {kv_cache.dtype}, "
                         f"head_dim {query.shape[2]}, device {query.device}); use prefill_attention.")
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    check_same_device(_hopper_prefill_kernel, query=query, kv_cache=kv_cache, query_start_loc=query_start_loc,
                      seq_lens=seq_lens, block_tables=block_tables, out=out)
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_q = BLOCK_M // group
    gl_dtype = gl.bfloat16 if query.dtype == torch.bfloat16 else gl.float16
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_q_blocks = num_tokens // block_q + num_seqs
    _hopper_prefill_kernel[(num_q_blocks, num_kv_heads)](
        out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        num_seqs, num_q_blocks, min_query_len, scale * LOG2_E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_M=BLOCK_M, TILE_N=TILE_N,
        STAGES=stages, Q_SMEM=gl.NVMMASharedLayout.get_default_for([BLOCK_M, head_dim], gl_dtype),
        KV_SMEM=gl.NVMMASharedLayout.get_default_for([TILE_N, head_dim], gl_dtype),
        num_warps=NUM_WARPS,
    )
    return out


__all__ = ["hopper_prefill_attention", "supports", "HAS_GLUON"]
