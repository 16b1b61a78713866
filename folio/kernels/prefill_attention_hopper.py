"""Prefill attention for Hopper in Gluon: long prompt chunks, with the K/V tiles brought by a loader
warp and the scores of the next tile computed while this tile's softmax runs.

The Triton kernel (prefill_attention.py) reaches ~60-64% of the matrix rate on long chunks: all its
warps compute gather addresses and wait on each tile's cp.async, and Triton 3.6 waits on every
wgmma before the softmax (docs/perf-notes.md, session 17). Gluon states the waits and the warps'
roles itself. A program owns (q block, KV head) as the Triton kernel does: BLOCK_M = 128 rows of
BLOCK_Q query tokens x the GROUP heads of one KV head, two warpgroups (8 warps) of 64 rows, q in
shared memory for the whole loop, tiles the block sees in full unmasked and the diagonal's masked
(two loops: ptxas waits for every pending wgmma where control flow joins).

- `_hopper_prefill_ws_kernel`: `warp_specialize` into the 8 compute warps and a
  loader warp that issues TMA boxes (one per run of keys in a block) into a ring
  of STAGES buffers, with a ready and an empty mbarrier per stage. Step j: issue S(j+1) = q K(j+1)^T
  (async), rescale the output under it, issue P(j) V(j) (P from registers), wait for S(j+1) only,
  then tile j+1's softmax runs under P(j) V(j), which step j+1 waits for before handing tile j's
  stage back. Whole-block boxes read stale slots past a chunk's end: masked steps zero those V
  rows in shared memory (their P is 0; 0 x a non-finite stale V would still be NaN).
  Measured (H100, sessions 17-18): 9-15% faster than the Triton kernel on 8k chunks, TTFT of the
  0.6B 35-36 vs 39-40 ms (8k) and 273-281 vs 307-315 ms (30k). P is packed to 16 bits right after
  the softmax and named in the next wait's deps (ptxas does not guard an async wgmma's register
  operand: without the dep, the next softmax overwrote P under the running P V; with it, the
  sm_90 compile test reads the SASS of every admitted shape for such a write).
  (Session 17 also measured an all-warps cp.async version with the same step: no faster than
  the Triton kernel; and TMA issued by every warp behind a CTA barrier: slower. Both removed.)

bf16 / fp16 caches of the query's dtype, head_dim 128, blocks of 16-128 tokens, 1-8 query heads a
KV head, no sliding window (`supports`); the backend sends other batches to the Triton kernel, and
`FOLIO_PREFILL_KERNEL=triton` sends all of them (triton_backend.py). Gluon kernels do not run in
Triton's interpreter: the CPU tests check the dispatch, tests/kernels/test_compile_sm90.py compiles
it for sm_90 (and fails on a serialized wgmma or a write to an in-flight wgmma's register operand).
"""

from __future__ import annotations

import functools

import torch

from folio.kernels.paged_attention import LOG2_E, check_attention_inputs, check_output
from folio.kernels.sass_checks import check_compiled
from folio.kernels.triton_compat import check_same_device

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except ImportError:  # a CPU install without Triton, or a Triton without Gluon
    HAS_GLUON = False

BLOCK_M = 128  # rows a program: two warpgroups of 64
TILE_N = 64  # keys a step
STAGES = 4  # K/V buffers in the ring (measured: 4 and 6 alike, 5 slower)
NUM_WARPS = 8  # the compute warps; the loader's warpgroup comes on top
# 8 compute warps + the loader's warpgroup share the register file, so the
# launch caps a thread at WS_MAXNREG (12 warps x 32 x 168 <= 65,536); the loader keeps
# WS_LOADER_REGS and the compute warps take the rest (setmaxnreg).
WS_MAXNREG = 168
SMEM_BYTES = 232_448 - 1_024  # Hopper's shared memory a block, less room for the barriers
WS_LOADER_REGS = 40


@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


ADMITTED_GROUPS = (1, 2, 4, 8)  # query heads a KV head, run on the GPU (session 18)
ADMITTED_BLOCKS = (16, 32, 64, 128)  # tokens a KV block, run on the GPU (session 18)


def supports(query: torch.Tensor, kv_cache: torch.Tensor, sliding_window: int | None) -> bool:
    """Whether this kernel takes the batch: a Hopper GPU, a contiguous 16-bit cache of the query's
    dtype, no sliding window, and the shapes that passed the GPU tests and measured faster than
    the Triton kernel (session 18, H100, 8k chunks: 9-15% faster): head_dim 128, 1, 2, 4 or 8
    query heads a KV head, blocks of 16, 32, 64 or 128 tokens. head_dim 64 is correct but 4-17%
    slower than the Triton kernel, so it stays there (`_launch` still takes it, for the tests)."""
    if not (HAS_GLUON and query.is_cuda):
        return False
    if not _is_hopper(query.device.index if query.device.index is not None else torch.cuda.current_device()):
        return False
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    return (query.dtype in (torch.float16, torch.bfloat16) and kv_cache.dtype == query.dtype
            and head_dim == 128 and block_size in ADMITTED_BLOCKS and num_heads % num_kv_heads == 0
            and num_heads // num_kv_heads in ADMITTED_GROUPS and not sliding_window and kv_cache[0].is_contiguous())


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

    # ---- warp-specialised: a loader warp brings K/V by TMA, 8 warps compute ----------------------
    @gluon.jit
    def _box_ids(table, t, k_hi, BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr, BOX: gl.constexpr):
        """The blocks of tile t's TILE_N // BOX boxes (up to 8; unused ones repeat the first), 0 past
        the sequence's blocks. All loads are issued before the loader's first TMA waits on one."""
        k0 = t * TILE_N
        id0 = gl.load(table + k0 // BLOCK_SIZE, mask=k0 < k_hi, other=0)
        id1 = id0
        id2 = id0
        id3 = id0
        id4 = id0
        id5 = id0
        id6 = id0
        id7 = id0
        if TILE_N // BOX > 1:
            id1 = gl.load(table + (k0 + BOX) // BLOCK_SIZE, mask=k0 + BOX < k_hi, other=0)
        if TILE_N // BOX > 2:
            id2 = gl.load(table + (k0 + 2 * BOX) // BLOCK_SIZE, mask=k0 + 2 * BOX < k_hi, other=0)
            id3 = gl.load(table + (k0 + 3 * BOX) // BLOCK_SIZE, mask=k0 + 3 * BOX < k_hi, other=0)
        if TILE_N // BOX > 4:
            id4 = gl.load(table + (k0 + 4 * BOX) // BLOCK_SIZE, mask=k0 + 4 * BOX < k_hi, other=0)
            id5 = gl.load(table + (k0 + 5 * BOX) // BLOCK_SIZE, mask=k0 + 5 * BOX < k_hi, other=0)
            id6 = gl.load(table + (k0 + 6 * BOX) // BLOCK_SIZE, mask=k0 + 6 * BOX < k_hi, other=0)
            id7 = gl.load(table + (k0 + 7 * BOX) // BLOCK_SIZE, mask=k0 + 7 * BOX < k_hi, other=0)
        return id0, id1, id2, id3, id4, id5, id6, id7

    @gluon.jit
    def _ws_loader(k_desc, v_desc, k_bufs, v_bufs, ready, empty, table, k_hi, kv_col, n_tiles,
                   BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr):
        """Tiles 0 .. n_tiles (the last one the final step's look-ahead, masked away) by TMA, one
        [BOX, HEAD_DIM] box per run of keys in one block, each into its ring stage once the
        compute warps have released it. Keys past the sequence load whatever their block holds;
        the compute side zeroes those V rows (_zero_v_past) and masks their scores."""
        for t in range(0, n_tiles + 1):
            stage = t % STAGES
            mbarrier.wait(empty.index(stage), ((t // STAGES) & 1) ^ 1)  # barriers start with phase 1 complete
            ids = _box_ids(table, t, k_hi, BLOCK_SIZE, TILE_N, BOX)
            bar = ready.index(stage)
            mbarrier.expect(bar, 2 * (TILE_N // BOX) * k_desc.block_type.nbytes)
            for b in gl.static_range(TILE_N // BOX):
                row = ids[b] * BLOCK_SIZE + (t * TILE_N + b * BOX) % BLOCK_SIZE
                tma.async_copy_global_to_shared(k_desc, [row, kv_col], bar, k_bufs.index(stage).slice(b * BOX, BOX))
                tma.async_copy_global_to_shared(v_desc, [row, kv_col], bar, v_bufs.index(stage).slice(b * BOX, BOX))

    @gluon.jit
    def _zero_v_past(v_bufs, j, k_hi, TILE_N: gl.constexpr, STAGES: gl.constexpr, load_layout: gl.constexpr):
        """Tile j's V rows of keys >= k_hi set to 0 in shared memory: their P is 0, and 0 x a stale
        non-finite V would still be NaN."""
        buf = v_bufs.index(j % STAGES)
        k_pos = j * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(1, load_layout))
        v = buf.load(load_layout)
        buf.store(gl.where((k_pos < k_hi)[:, None], v, gl.zeros_like(v)))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _ws_step(j, acc, p, p_prev, alpha, m_i, l_i, q_smem, k_bufs, v_bufs, ready, empty, k_hi, first_q, q_pos,
                 scale_log2, zeros_s, MASKED: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr,
                 o_rows: gl.constexpr, s_cols: gl.constexpr, p_layout: gl.constexpr, load_layout: gl.constexpr):
        """Step j: wait for tile j + 1 on its mbarrier and for P(j-1) V(j-1), hand tile j - 1's stage
        back (the wait, barrier and arrive sit here, not at the end of step j - 1, so that ptxas keeps
        P V running under the softmax), then S(j+1) under the rescale and tile j + 1's softmax under
        P(j) V(j), which is returned still running."""
        mbarrier.wait(ready.index((j + 1) % STAGES), ((j + 1) // STAGES) & 1)
        # P(j-1) V(j-1), left running under step j - 1's softmax. p_prev (its operand) is a dep of
        # the wait, so its values stay live to here; the packed registers the wgmma reads are
        # ptxas's to place, and tests/kernels/test_compile_sm90.py checks at every admitted shape
        # that the softmax does not write them before this wait
        acc, p_prev = warpgroup_mma_wait(0, deps=(acc, p_prev))
        gl.thread_barrier()  # both warpgroups are done with tile j - 1
        mbarrier.arrive(empty.index((j + STAGES - 1) % STAGES), count=1, pred=j > 0)
        if MASKED:
            _zero_v_past(v_bufs, j, k_hi, TILE_N, STAGES, load_layout)
        s_next = warpgroup_mma(q_smem, k_bufs.index((j + 1) % STAGES).permute((1, 0)), zeros_s, use_acc=False,
                               is_async=True)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        pv = warpgroup_mma(p, v_bufs.index(j % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_next,))
        p_next, alpha, m_i, l_i = _softmax_step(s, (j + 1) * TILE_N, first_q, q_pos, k_hi, m_i, l_i, scale_log2,
                                                MASKED, TILE_N, s_cols)
        return pv, gl.convert_layout(p_next.to(q_smem.dtype), p_layout), p, alpha, m_i, l_i

    @gluon.jit
    def _ws_compute(q_smem, k_bufs, v_bufs, ready, empty, k_hi, first_q, n_tiles, n_open, scale_log2,
                    GROUP: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, TILE_N: gl.constexpr,
                    STAGES: gl.constexpr):
        """The compute warps' loop (the default partition): (acc, l) of the q block."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, TILE_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [8, 1], [1, 0])
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        zeros_s = gl.zeros([BLOCK_M, TILE_N], gl.float32, s_layout)
        q_pos = first_q + gl.arange(0, BLOCK_M, layout=s_rows) // GROUP
        acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout))
        mbarrier.wait(ready.index(0), 0)
        s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zeros_s, use_acc=False)
        p, alpha, m_i, l_i = _softmax_step(s, 0, first_q, q_pos, k_hi, gl.full([BLOCK_M], float("-inf"), gl.float32,
                                           s_rows), gl.zeros([BLOCK_M], gl.float32, s_rows), scale_log2, True,
                                           TILE_N, s_cols)
        p = gl.convert_layout(p.to(q_smem.dtype), p_layout)  # 16-bit from here: half the registers over the step
        p_prev = p  # the operand of the P V in flight (none yet)
        for j in range(0, n_open):
            acc, p, p_prev, alpha, m_i, l_i = _ws_step(
                j, acc, p, p_prev, alpha, m_i, l_i, q_smem, k_bufs, v_bufs, ready, empty, k_hi, first_q, q_pos,
                scale_log2, zeros_s, False, TILE_N, STAGES, o_rows, s_cols, p_layout, load_layout)
        for j in range(n_open, n_tiles):
            acc, p, p_prev, alpha, m_i, l_i = _ws_step(
                j, acc, p, p_prev, alpha, m_i, l_i, q_smem, k_bufs, v_bufs, ready, empty, k_hi, first_q, q_pos,
                scale_log2, zeros_s, True, TILE_N, STAGES, o_rows, s_cols, p_layout, load_layout)
        acc, p_prev = warpgroup_mma_wait(0, deps=(acc, p_prev))
        return acc, gl.convert_layout(l_i, o_rows)

    @gluon.jit(do_not_specialize=["num_seqs", "num_q_blocks", "min_query_len"])
    def _hopper_prefill_ws_kernel(
        out_ptr, query_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, num_q_blocks, min_query_len, scale_log2, q_stride_t, q_stride_h, o_stride_t, o_stride_h, bt_stride,
        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_SIZE: gl.constexpr, BLOCK_Q: gl.constexpr,
        BLOCK_M: gl.constexpr, TILE_N: gl.constexpr, STAGES: gl.constexpr, BOX: gl.constexpr,
        Q_SMEM: gl.constexpr, KV_SMEM: gl.constexpr, LOADER_REGS: gl.constexpr,
    ):
        """prefill_attention.py's programs with the K/V tiles brought by a loader warp (TMA boxes,
        ready/empty mbarriers per ring stage) so the 8 compute warps never wait on a gather."""
        dtype: gl.constexpr = query_ptr.dtype.element_ty
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [8, 1], [1, 0])
        q_block = num_q_blocks - 1 - gl.program_id(0)  # last blocks (most keys) first
        kv_head = gl.program_id(1)
        seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
        q_start = gl.load(query_start_loc_ptr + seq)
        q_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
        local_block = q_block - (q_start // BLOCK_Q + seq)
        if local_block * BLOCK_Q >= q_len or q_len < min_query_len:
            return
        context_len = gl.load(seq_lens_ptr + seq) - q_len
        first_q = context_len + local_block * BLOCK_Q
        k_hi = context_len + gl.minimum(local_block * BLOCK_Q + BLOCK_Q, q_len)
        table = block_tables_ptr + seq.to(gl.int64) * bt_stride

        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, load_layout))
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, load_layout))
        tok = local_block * BLOCK_Q + rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        q_ptrs = query_ptr + (q_start + tok).to(gl.int64)[:, None] * q_stride_t + head[:, None] * q_stride_h + dims[None, :]
        q = gl.load(q_ptrs, mask=(tok < q_len)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM, q)
        fence_async_shared()
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, TILE_N, HEAD_DIM], KV_SMEM)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, TILE_N, HEAD_DIM], KV_SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        n_tiles = gl.cdiv(k_hi, TILE_N)
        n_open = gl.maximum(((first_q + 1) // TILE_N) - 1, 0)
        acc, l_o = gl.warp_specialize([
            (_ws_compute, (q_smem, k_bufs, v_bufs, ready, empty, k_hi, first_q, n_tiles, n_open, scale_log2, GROUP,
                           BLOCK_M, HEAD_DIM, TILE_N, STAGES)),
            (_ws_loader, (k_desc, v_desc, k_bufs, v_bufs, ready, empty, table, k_hi, kv_head * HEAD_DIM, n_tiles,
                          BLOCK_SIZE, TILE_N, BOX, STAGES)),
        ], [1], [LOADER_REGS])

        out = acc / l_o[:, None]
        rows_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        dims_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
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
    tile_n: int = TILE_N,
) -> torch.Tensor:
    """Causal paged attention of the sequences with >= min_query_len new tokens (prefill_attention's
    contract, no sliding window); rows of other sequences are left untouched in out."""
    check_attention_inputs(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, None)
    if not supports(query, kv_cache, None):
        raise ValueError(f"hopper_prefill_attention: unsupported batch (dtype {query.dtype}, cache {kv_cache.dtype}, "
                         f"head_dim {query.shape[2]}, block size {kv_cache.shape[2]}, device {query.device}); "
                         "use prefill_attention.")
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    check_same_device(_hopper_prefill_ws_kernel, query=query, kv_cache=kv_cache, query_start_loc=query_start_loc,
                      seq_lens=seq_lens, block_tables=block_tables, out=out)
    return _launch(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, scale, out, min_query_len,
                   stages, tile_n)


def _launch(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, scale, out, min_query_len,
            stages, tile_n=TILE_N) -> torch.Tensor:
    """The launch without `supports`' shape gate (GPU tests of shapes not yet admitted call it):
    any Hopper-resident 16-bit batch with head_dim 64 or 128, a power-of-two group <= BLOCK_M and
    blocks of 16, 32, 64 or a multiple of 64 tokens."""
    if stages < 3:
        raise ValueError(f"hopper_prefill_attention: stages must be >= 3 (tiles j .. j + 2 in the ring), got {stages}.")
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_q = BLOCK_M // group
    gl_dtype = gl.bfloat16 if query.dtype == torch.bfloat16 else gl.float16
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, kv_heads, dim], contiguous
    rows, cols = k_cache.shape[0] * block_size, num_kv_heads * head_dim
    if tile_n not in (64, 128):
        raise ValueError(f"hopper_prefill_attention: tile_n must be 64 or 128, got {tile_n}.")
    smem = (2 * stages * tile_n + BLOCK_M) * head_dim * query.element_size()
    if smem > SMEM_BYTES:
        raise ValueError(f"hopper_prefill_attention: {stages} stages of {tile_n} keys need {smem} bytes of shared "
                         f"memory, more than Hopper's {SMEM_BYTES}.")
    kv_smem = gl.NVMMASharedLayout.get_default_for([tile_n, head_dim], gl_dtype)
    box = min(block_size, tile_n)
    if box < 16 or tile_n % box or block_size % box or head_dim not in (64, 128):
        raise ValueError(f"hopper_prefill_attention: block size {block_size} / head_dim {head_dim} not laid out "
                         "(blocks of 16, 32, 64 or a multiple of 64 tokens; head_dim 64 or 128).")
    k_desc, v_desc = (TensorDescriptor(cache.view(rows, cols), [rows, cols], [cols, 1], [box, head_dim], kv_smem)
                      for cache in (k_cache, v_cache))
    num_q_blocks = num_tokens // block_q + num_seqs
    kernel = _hopper_prefill_ws_kernel[(num_q_blocks, num_kv_heads)](
        out, query, k_desc, v_desc, block_tables, seq_lens, query_start_loc, num_seqs, num_q_blocks, min_query_len,
        scale * LOG2_E, query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_M=BLOCK_M, TILE_N=tile_n,
        STAGES=stages, BOX=box, Q_SMEM=gl.NVMMASharedLayout.get_default_for([BLOCK_M, head_dim], gl_dtype),
        KV_SMEM=kv_smem, LOADER_REGS=WS_LOADER_REGS, num_warps=NUM_WARPS, maxnreg=WS_MAXNREG)
    check_compiled(kernel, "the Gluon prefill")  # a racy compilation raises; the backend falls back
    return out



__all__ = ["hopper_prefill_attention", "supports", "HAS_GLUON"]
