"""The loader warpgroup of the Gluon prefill (prefill_attention_hopper.py): a sequence's K and V
tiles from the paged cache into shared-memory rings by TMA, one [BOX, HEAD_DIM] box per run of
keys in one block, each ring stage filled once both consumers have handed it back; and, on the
host, the TMA descriptors it reads the cache through (`kv_descriptors`, made once per cache)."""

from __future__ import annotations

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except ImportError:  # a CPU install without Triton, or a Triton without Gluon
    HAS_GLUON = False

if HAS_GLUON:

    @gluon.jit
    def _box_ids(table, t, seq_end, BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr, BOX: gl.constexpr):
        """The blocks of tile t's TILE_N // BOX boxes (up to 8; unused ones repeat the first), 0 past
        the sequence's end. All loads are issued before the loader's first TMA waits on one."""
        k0 = t * TILE_N
        id0 = gl.load(table + k0 // BLOCK_SIZE, mask=k0 < seq_end, other=0)
        id1 = id0
        id2 = id0
        id3 = id0
        id4 = id0
        id5 = id0
        id6 = id0
        id7 = id0
        if TILE_N // BOX > 1:
            id1 = gl.load(table + (k0 + BOX) // BLOCK_SIZE, mask=k0 + BOX < seq_end, other=0)
        if TILE_N // BOX > 2:
            id2 = gl.load(table + (k0 + 2 * BOX) // BLOCK_SIZE, mask=k0 + 2 * BOX < seq_end, other=0)
            id3 = gl.load(table + (k0 + 3 * BOX) // BLOCK_SIZE, mask=k0 + 3 * BOX < seq_end, other=0)
        if TILE_N // BOX > 4:
            id4 = gl.load(table + (k0 + 4 * BOX) // BLOCK_SIZE, mask=k0 + 4 * BOX < seq_end, other=0)
            id5 = gl.load(table + (k0 + 5 * BOX) // BLOCK_SIZE, mask=k0 + 5 * BOX < seq_end, other=0)
            id6 = gl.load(table + (k0 + 6 * BOX) // BLOCK_SIZE, mask=k0 + 6 * BOX < seq_end, other=0)
            id7 = gl.load(table + (k0 + 7 * BOX) // BLOCK_SIZE, mask=k0 + 7 * BOX < seq_end, other=0)
        return id0, id1, id2, id3, id4, id5, id6, id7

    @gluon.jit
    def _tma_tile(desc, ids, t, kv_col, bar, buf, BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr,
                  BOX: gl.constexpr):
        """Tile t's [TILE_N, HEAD_DIM] of one KV head into buf, one box per run of keys in a block."""
        for b in gl.static_range(TILE_N // BOX):
            row = ids[b] * BLOCK_SIZE + (t * TILE_N + b * BOX) % BLOCK_SIZE
            tma.async_copy_global_to_shared(desc, [row, kv_col], bar, buf.slice(b * BOX, BOX))

    @gluon.jit
    def kv_loader(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, table, seq_end, kv_col,
                  n_tiles, BLOCK_SIZE: gl.constexpr, TILE_N: gl.constexpr, BOX: gl.constexpr, KS: gl.constexpr,
                  VS: gl.constexpr):
        """K of tiles 0 .. n_tiles (the last one the final step's look-ahead, masked away) and V of
        tiles 0 .. n_tiles - 1, each into its ring once both consumers have handed the stage back."""
        nbytes: gl.constexpr = (TILE_N // BOX) * k_desc.block_type.nbytes
        for t in range(0, n_tiles + 1):
            ids = _box_ids(table, t, seq_end, BLOCK_SIZE, TILE_N, BOX)
            ks = t % KS
            mbarrier.wait(k_empty.index(ks), ((t // KS) & 1) ^ 1)  # barriers start with phase 1 complete
            mbarrier.expect(k_ready.index(ks), nbytes)
            _tma_tile(k_desc, ids, t, kv_col, k_ready.index(ks), k_bufs.index(ks), BLOCK_SIZE, TILE_N, BOX)
            if t < n_tiles:
                vs = t % VS
                mbarrier.wait(v_empty.index(vs), ((t // VS) & 1) ^ 1)
                mbarrier.expect(v_ready.index(vs), nbytes)
                _tma_tile(v_desc, ids, t, kv_col, v_ready.index(vs), v_bufs.index(vs), BLOCK_SIZE, TILE_N, BOX)


def kv_descriptors(kv_cache: torch.Tensor, box: int, kv_smem) -> tuple:  # noqa: ANN001
    """The TMA descriptors of the K and V caches ([num_blocks * block_size, kv_heads * dim] each),
    kept on the cache tensor itself (the layer's long-lived cache), remade if its storage, shape or
    box changes. They point at the storage through aliases that are not views, so they hold no
    reference to the tensor object and go when it goes (no cycle for the collector to find)."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    if not kv_cache.is_contiguous():  # the aliases assume it (the old views checked it)
        raise ValueError("hopper_prefill_attention: the KV cache must be contiguous.")
    key = (kv_cache.data_ptr(), tuple(kv_cache.shape), tuple(kv_cache.stride()), kv_cache.dtype, box)
    cached = getattr(kv_cache, "_folio_tma_descriptors", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    rows, cols = num_blocks * block_size, num_kv_heads * head_dim
    descs = tuple(TensorDescriptor(alias_storage(kv_cache, half * kv_cache.stride(0), rows, cols), [rows, cols],
                                   [cols, 1], [box, head_dim], kv_smem) for half in (0, 1))
    kv_cache._folio_tma_descriptors = (key, descs)
    return descs


def alias_storage(t: torch.Tensor, offset: int, rows: int, cols: int) -> torch.Tensor:
    """A [rows, cols] tensor over t's storage from element `offset` on (t contiguous), not a view of t."""
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    return alias.set_(t.untyped_storage(), t.storage_offset() + offset, (rows, cols), (cols, 1))


__all__ = ["kv_descriptors", "kv_loader"]
