"""Prefill attention for Hopper in Gluon: long prompt chunks, K/V tiles brought by a loader
warpgroup, and two consumer warpgroups that take turns at the tensor cores (FlashAttention-3's
ping-pong). The Triton kernel (prefill_attention.py) reaches ~60% of the matrix rate on long
chunks (docs/perf-notes.md, sessions 17-19 for what was tried and measured).

A program owns (q block, KV head) as the Triton kernel does: BLOCK_M = 128 rows of BLOCK_Q query
tokens x the GROUP heads of one KV head, q in shared memory for the whole loop.
- `hopper_kv_loader.kv_loader` (the default partition): one TMA box per run of keys in a block, K
  and V in rings of their own (K(j+1) handed back once S(j+1) is done, V(j) once P(j) V(j) is).
- `_consumer` (two 64-row worker partitions), step j: in this warpgroup's turn (named barriers 8
  and 9) issue S(j+1) = q K(j+1)^T and P(j) V(j), hand the turn over, run tile j + 1's softmax
  under the other's products, wait for P(j) V(j) and pack P(j+1). Tiles are 128 keys, so that the
  softmax and its fixed costs fit under them (at 64 keys they did not). P is P V's A operand in
  registers, as in FlashAttention-3 (2-16% faster than P through shared memory on 23 of 24 chunk
  shapes, session 26): nothing is in flight across the loop's back edge, which is what made
  ptxas serialize every wgmma of a worker partition before (C7512, sessions 18-19). ptxas places
  the wait for P(j) V(j) before the exponentials, so a warpgroup's softmax runs under the other's
  products only. Each compilation's SASS is read at its first launch for a write to P's
  registers while P V runs (sass_checks.check_no_wgmma_race; the backend then falls back).
- Tiles the block sees in full are unmasked, the diagonal's masked (two loops: ptxas waits for
  every pending wgmma where control flow joins). Boxes read whole blocks, so a tile that reaches
  past the sequence's end has its stale V rows zeroed in shared memory first (P = 0 there, but
  0 x a non-finite V is NaN); keys past a q block's diagonal inside the sequence are the chunk's
  own, already written.

bf16 / fp16 caches of the query's dtype, head_dim 128, blocks of 16-128 tokens, 1-8 query heads a
KV head, no sliding window (`supports`); other batches, and all with FOLIO_PREFILL_KERNEL=triton,
go to the Triton kernel (triton_backend.py). Gluon does not run in Triton's interpreter: the CPU
tests check the dispatch; tests/kernels/test_compile_sm90.py compiles every admitted shape for
sm_90 and fails on a serialized wgmma or a spill.
"""

from __future__ import annotations

import functools

import torch

from folio.kernels.paged_attention import LOG2_E, check_attention_inputs, check_output
from folio.kernels.sass_checks import check_no_wgmma_race
from folio.kernels.triton_compat import check_same_device

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from folio.kernels.hopper_kv_loader import kv_descriptors, kv_loader

    HAS_GLUON = True
except ImportError:  # a CPU install without Triton, or a Triton without Gluon
    HAS_GLUON = False

BLOCK_M = 128  # rows a program: two consumer warpgroups of 64
TILE_N = 128  # keys a step
K_STAGES = 2  # K tiles in their ring (tile j + 1 in use, j + 2 loading)
V_STAGES = 2  # V tiles in theirs (tile j in use, j + 1 loading)
# With P in registers 3 stages of each fit (229,376 bytes); measured mixed, -4% to +4% against 2
# across chunk shapes (session 26), so 2 stay.
LOADER_WARPS = 4  # the default partition: warp specialisation hands out whole warpgroups
# 4 loader + 8 consumer warps share the register file, so the launch caps a thread at WS_MAXNREG
# (12 warps x 32 x 168 <= 65,536); the consumers raise theirs to CONSUMER_REGS by setmaxnreg
# (~200 used at 128-key tiles), the loader keeps the rest.
WS_MAXNREG = 168
CONSUMER_REGS = 232
SMEM_BYTES = 232_448 - 1_024  # Hopper's shared memory a block, less room for the barriers


@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


ADMITTED_GROUPS = (1, 2, 4, 8)  # query heads a KV head, run on the GPU (sessions 18-19)
ADMITTED_BLOCKS = (16, 32, 64, 128)  # tokens a KV block, run on the GPU (sessions 18-19)


def supports(query: torch.Tensor, kv_cache: torch.Tensor, sliding_window: int | None) -> bool:
    """Whether this kernel takes the batch: a Hopper GPU, a contiguous 16-bit cache of the query's
    dtype, no sliding window, and the shapes that passed the GPU tests (sessions 18-19): head_dim
    128, 1, 2, 4 or 8 query heads a KV head, blocks of 16, 32, 64 or 128 tokens. head_dim 64 was
    slower than the Triton kernel (session 18), so it stays there (`_launch` takes it, for tests)."""
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
    def _softmax_step(s, start, q_pos, k_hi, m_i, l_i, scale_log2, MASKED: gl.constexpr,
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
    def _named_barrier(kind: gl.constexpr, bar_id: gl.constexpr):
        """bar.sync / bar.arrive of the two consumers (256 threads) on named barrier bar_id (8 and 9:
        Triton takes the low ids for its own barriers)."""
        one = gl.full([128], 0, gl.int32, gl.BlockedLayout([1], [32], [4], [0]))
        gl.inline_asm_elementwise(f"{kind} {bar_id}, 256; mov.b32 $0, 0;", "=r,r", [one], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _zero_v_past(buf, j, k_hi, TILE_N: gl.constexpr, load_layout: gl.constexpr):
        """Tile j's V rows of keys >= k_hi set to 0, 16 rows at a time (a whole tile in registers
        costs a warpgroup 64 of them). Both consumers do it, so neither waits for the other: each
        byte is written with the value it holds or with 0 both times, but by the letter of the
        memory model that races with the other's wgmma reading the tile (one writer would need a
        256-thread barrier on that tile; not measured)."""
        for r0 in gl.static_range(0, TILE_N, 16):
            rows = buf.slice(r0, 16)
            k_pos = j * TILE_N + r0 + gl.arange(0, 16, layout=gl.SliceLayout(1, load_layout))
            v = rows.load(load_layout)
            rows.store(gl.where((k_pos < k_hi)[:, None], v, gl.zeros_like(v)))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _step(j, acc, p_cur, m_i, l_i, q_half, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, k_hi, seq_end,
              q_pos, scale_log2, zeros_s, HALF: gl.constexpr, MASKED: gl.constexpr, TILE_N: gl.constexpr,
              KS: gl.constexpr, VS: gl.constexpr, o_rows: gl.constexpr, s_cols: gl.constexpr,
              load_layout: gl.constexpr, p_layout: gl.constexpr, PINGPONG: gl.constexpr):
        """Step j of one consumer, P(j) in registers: issue S(j+1) and P(j) V(j) in this warpgroup's turn;
        hand K(j+1) back once S(j+1) is done; tile j + 1's softmax; wait for P(j) V(j) (p_cur in the
        deps keeps its registers alive to the wait), hand V(j) back, rescale and pack P(j+1)."""
        mbarrier.wait(k_ready.index((j + 1) % KS), ((j + 1) // KS) & 1)
        mbarrier.wait(v_ready.index(j % VS), (j // VS) & 1)
        v_buf = v_bufs.index(j % VS)
        if MASKED:
            if (j + 1) * TILE_N > seq_end:  # slots past the sequence's end: stale, maybe not finite
                _zero_v_past(v_buf, j, k_hi, TILE_N, load_layout)
        if PINGPONG:
            _named_barrier("bar.sync", 8 + HALF)  # this warpgroup's turn at the tensor cores
        s_next = warpgroup_mma(q_half, k_bufs.index((j + 1) % KS).permute((1, 0)), zeros_s, use_acc=False,
                               is_async=True)
        acc = warpgroup_mma(p_cur, v_buf, acc, is_async=True)
        if PINGPONG:
            _named_barrier("bar.arrive", 9 - HALF)  # the other's turn
        s = warpgroup_mma_wait(1, deps=(s_next,))
        gl.thread_barrier()
        mbarrier.arrive(k_empty.index((j + 1) % KS), count=1)
        p_next, alpha, m_i, l_i = _softmax_step(s, (j + 1) * TILE_N, q_pos, k_hi, m_i, l_i, scale_log2, MASKED,
                                                TILE_N, s_cols)
        acc, p_cur = warpgroup_mma_wait(0, deps=(acc, p_cur))
        gl.thread_barrier()
        mbarrier.arrive(v_empty.index(j % VS), count=1)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p_cur = gl.convert_layout(p_next.to(q_half.dtype), p_layout)
        return acc, p_cur, m_i, l_i

    @gluon.jit
    def _consumer(q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, out_ptr, k_hi, seq_end,
                  first_q, n_tiles, n_open, scale_log2, out_row0, q_len_left, head0, o_stride_t, o_stride_h,
                  HALF: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, TILE_N: gl.constexpr,
                  KS: gl.constexpr, VS: gl.constexpr, PINGPONG: gl.constexpr):
        """One warpgroup's 64 rows (HALF 0 or 1 of the program's 128): tile 0, the loop, the output."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, TILE_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [4, 1], [1, 0])
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        q_half = q_smem.index(HALF)
        zeros_s = gl.zeros([64, TILE_N], gl.float32, s_layout)
        q_pos = first_q + (HALF * 64 + gl.arange(0, 64, layout=s_rows)) // GROUP
        acc = gl.zeros([64, HEAD_DIM], gl.float32, o_layout)
        if PINGPONG:
            if HALF == 1:
                _named_barrier("bar.arrive", 8)  # warpgroup 0 goes first
        mbarrier.wait(k_ready.index(0), 0)
        s = warpgroup_mma(q_half, k_bufs.index(0).permute((1, 0)), zeros_s, use_acc=False)
        gl.thread_barrier()
        mbarrier.arrive(k_empty.index(0), count=1)
        p, _, m_i, l_i = _softmax_step(s, 0, q_pos, k_hi, gl.full([64], float("-inf"), gl.float32, s_rows),
                                       gl.zeros([64], gl.float32, s_rows), scale_log2, True, TILE_N, s_cols)
        p_cur = gl.convert_layout(p.to(q_half.dtype), p_layout)
        for j in range(0, n_open):
            acc, p_cur, m_i, l_i = _step(j, acc, p_cur, m_i, l_i, q_half, k_bufs, v_bufs, k_ready, k_empty,
                                         v_ready, v_empty, k_hi, seq_end, q_pos, scale_log2, zeros_s, HALF, False,
                                         TILE_N, KS, VS, o_rows, s_cols, load_layout, p_layout, PINGPONG)
        for j in range(n_open, n_tiles):
            acc, p_cur, m_i, l_i = _step(j, acc, p_cur, m_i, l_i, q_half, k_bufs, v_bufs, k_ready, k_empty,
                                         v_ready, v_empty, k_hi, seq_end, q_pos, scale_log2, zeros_s, HALF, True,
                                         TILE_N, KS, VS, o_rows, s_cols, load_layout, p_layout, PINGPONG)
        if PINGPONG:
            if HALF == 0:
                _named_barrier("bar.sync", 8)  # warpgroup 1's last arrive
        out = acc / gl.convert_layout(l_i, o_rows)[:, None]
        rows = HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        tok = rows // GROUP
        head = head0 + rows % GROUP
        ptrs = out_ptr + (out_row0 + tok).to(gl.int64)[:, None] * o_stride_t + head[:, None] * o_stride_h + dims[None, :]
        gl.store(ptrs, out.to(q_half.dtype), mask=(tok < q_len_left)[:, None] & (dims < HEAD_DIM)[None, :])

    @gluon.jit(do_not_specialize=["num_seqs", "num_q_blocks", "min_query_len"])
    def _hopper_prefill_kernel(
        out_ptr, query_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, num_q_blocks, min_query_len, scale_log2, q_stride_t, q_stride_h, o_stride_t, o_stride_h, bt_stride,
        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_SIZE: gl.constexpr, BLOCK_Q: gl.constexpr,
        TILE_N: gl.constexpr, KS: gl.constexpr, VS: gl.constexpr, BOX: gl.constexpr,
        Q_SMEM: gl.constexpr, KV_SMEM: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        PINGPONG: gl.constexpr,
    ):
        """prefill_attention.py's programs: q to shared memory, then the loader and the two consumers."""
        dtype: gl.constexpr = query_ptr.dtype.element_ty
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [4, 1], [1, 0])
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

        q_smem = gl.allocate_shared_memory(dtype, [2, 64, HEAD_DIM], Q_SMEM)
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, load_layout))
        for half in gl.static_range(2):
            rows = half * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, load_layout))
            tok = local_block * BLOCK_Q + rows // GROUP
            head = kv_head * GROUP + rows % GROUP
            ptrs = (query_ptr + (q_start + tok).to(gl.int64)[:, None] * q_stride_t + head[:, None] * q_stride_h
                    + dims[None, :])
            q_smem.index(half).store(gl.load(ptrs, mask=(tok < q_len)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0))
        fence_async_shared()
        k_bufs = gl.allocate_shared_memory(dtype, [KS, TILE_N, HEAD_DIM], KV_SMEM)
        v_bufs = gl.allocate_shared_memory(dtype, [VS, TILE_N, HEAD_DIM], KV_SMEM)
        k_ready = gl.allocate_shared_memory(gl.int64, [KS, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [KS, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [VS, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [VS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(KS):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # each consumer hands the stage back
        for i in gl.static_range(VS):
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
        seq_end = context_len + q_len
        n_tiles = gl.cdiv(k_hi, TILE_N)
        n_open = gl.maximum(((first_q + 1) // TILE_N) - 1, 0)
        out_row0 = q_start + local_block * BLOCK_Q
        q_len_left = q_len - local_block * BLOCK_Q
        gl.warp_specialize([
            (kv_loader, (k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, table, seq_end,
                         kv_head * HEAD_DIM, n_tiles, BLOCK_SIZE, TILE_N, BOX, KS, VS)),
            (_consumer, (q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, out_ptr, k_hi, seq_end,
                         first_q, n_tiles, n_open, scale_log2, out_row0, q_len_left, kv_head * GROUP, o_stride_t,
                         o_stride_h, 0, GROUP, HEAD_DIM, TILE_N, KS, VS, PINGPONG)),
            (_consumer, (q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, out_ptr, k_hi, seq_end,
                         first_q, n_tiles, n_open, scale_log2, out_row0, q_len_left, kv_head * GROUP, o_stride_t,
                         o_stride_h, 1, GROUP, HEAD_DIM, TILE_N, KS, VS, PINGPONG)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


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
    pingpong: bool = True,
) -> torch.Tensor:
    """Causal paged attention of the sequences with >= min_query_len new tokens (prefill_attention's
    contract, no sliding window); rows of other sequences are left untouched in out. pingpong=False
    lets the two consumers run free (no turns at the tensor cores; measured the same as the turns
    once the needless V zeroing was gone, session 19)."""
    check_attention_inputs(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, None)
    if not supports(query, kv_cache, None):
        raise ValueError(f"hopper_prefill_attention: unsupported batch (dtype {query.dtype}, cache {kv_cache.dtype}, "
                         f"head_dim {query.shape[2]}, block size {kv_cache.shape[2]}, device {query.device}); "
                         "use prefill_attention.")
    if out is None:
        out = torch.empty_like(query)
    check_output(out, query)
    check_same_device(_hopper_prefill_kernel, query=query, kv_cache=kv_cache, query_start_loc=query_start_loc,
                      seq_lens=seq_lens, block_tables=block_tables, out=out)
    return _launch(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, scale, out, min_query_len,
                   pingpong)


def _smem_bytes(head_dim: int, itemsize: int) -> int:
    """q and the K and V rings (P stays in registers)."""
    return (BLOCK_M + (K_STAGES + V_STAGES) * TILE_N) * head_dim * itemsize


def _launch(query, kv_cache, query_start_loc, seq_lens, block_tables, num_seqs, scale, out, min_query_len,
            pingpong=True) -> torch.Tensor:
    """The launch without `supports`' shape gate (GPU tests of shapes not yet admitted call it):
    any Hopper-resident 16-bit batch with head_dim 64 or 128, a power-of-two group <= BLOCK_M and
    blocks of 16, 32, 64 or a multiple of 128 tokens."""
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_heads % num_kv_heads or BLOCK_M % (num_heads // num_kv_heads):
        raise ValueError(f"hopper_prefill_attention: {num_heads} query heads over {num_kv_heads} KV heads; the "
                         f"group must divide the {BLOCK_M} rows of a program.")
    box = min(block_size, TILE_N)
    if box < 16 or TILE_N % box or block_size % box or head_dim not in (64, 128):
        raise ValueError(f"hopper_prefill_attention: block size {block_size} / head_dim {head_dim} not laid out "
                         "(blocks of 16, 32, 64 or a multiple of 128 tokens; head_dim 64 or 128).")
    smem = _smem_bytes(head_dim, query.element_size())
    if smem > SMEM_BYTES:  # a guard for edits to the constants above
        raise ValueError(f"hopper_prefill_attention: {smem} bytes of shared memory, more than Hopper's {SMEM_BYTES}.")
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_q = BLOCK_M // group
    q_smem, kv_smem = _layouts(head_dim, query.dtype)
    k_desc, v_desc = kv_descriptors(kv_cache, box, kv_smem)
    num_q_blocks = num_tokens // block_q + num_seqs
    kernel = _hopper_prefill_kernel[(num_q_blocks, num_kv_heads)](
        out, query, k_desc, v_desc, block_tables, seq_lens, query_start_loc, num_seqs, num_q_blocks, min_query_len,
        scale * LOG2_E, query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_Q=block_q, TILE_N=TILE_N, KS=K_STAGES,
        VS=V_STAGES, BOX=box, Q_SMEM=q_smem, KV_SMEM=kv_smem, CONSUMER_REGS=CONSUMER_REGS, PINGPONG=pingpong,
        num_warps=LOADER_WARPS, maxnreg=WS_MAXNREG)
    check_no_wgmma_race(kernel, "hopper_prefill_attention")  # raises once, on a race: the backend falls back
    return out


# Host work of a launch (session 23, H100): the layouts ~30 us and the two TMA descriptors
# ~50 us of a ~125 us launch, every layer of every step; a short chunk's prefill is bound by it.
# Both depend only on the shapes and on the (per-layer, long-lived) cache tensor, so they are made
# once (the descriptors: hopper_kv_loader.kv_descriptors).
@functools.lru_cache(maxsize=None)
def _layouts(head_dim: int, dtype: torch.dtype) -> tuple:
    """The shared-memory layouts of q and of the K/V tiles."""
    gl_dtype = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return (gl.NVMMASharedLayout.get_default_for([64, head_dim], gl_dtype),
            gl.NVMMASharedLayout.get_default_for([TILE_N, head_dim], gl_dtype))


__all__ = ["hopper_prefill_attention", "supports", "HAS_GLUON"]
