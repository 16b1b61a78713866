"""The unified paged attention kernel against the torch reference on mixed batches."""

from __future__ import annotations

import pytest
import torch

from folio.attention.backends.torch_ref import paged_attention_reference
from folio.kernels.paged_attention import TileConfig, unified_attention
from tests.kernels.paged_batch import assert_close, make_paged_batch

# A prefill chunk on top of cached context, a whole prompt, decodes, and a padding sequence.
MIXED_Q = [5, 1, 0, 7, 1, 2]
MIXED_SEQ = [13, 9, 0, 7, 30, 2]


def _run(batch, scale=0.3, sliding_window=None):
    md = batch.metadata
    out = torch.full_like(batch.query, float("nan"))  # poison: every real row must be written
    unified_attention(
        batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
        md.num_seqs, md.max_query_len, scale, sliding_window, out=out,
    )
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, scale, sliding_window)
    return out, expected


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size",
    [
        (3, 1, 20, 4),  # MQA, head_dim not a power of two
        (8, 2, 40, 16),  # GQA 4
        (6, 2, 32, 1),  # GQA 3 (BLOCK_M not a multiple of the group), block size 1
        (2, 2, 16, 128),  # MHA, blocks longer than every sequence
    ],
)
def test_mixed_batch_matches_reference(device, num_heads, num_kv_heads, head_dim, block_size):
    batch = make_paged_batch(MIXED_Q, MIXED_SEQ, num_heads, num_kv_heads, head_dim, block_size,
                             device=device, pad_tokens=3, seed=block_size)
    out, expected = _run(batch)
    real, pad = batch.real_rows.to(device), batch.padding_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)
    assert out[pad].isnan().all(), "rows owned by no sequence must be left untouched"


def test_long_prefill_chunks_use_tall_tiles(device):
    # max_query_len * group > 16 selects 64-row q tiles: q blocks cross sequence boundaries in
    # the flat batch, and several q blocks share one sequence.
    batch = make_paged_batch([40, 1, 23], [45, 60, 23], 4, 2, 32, 8, device=device, seed=3)
    out, expected = _run(batch)
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("config", [TileConfig(16, 16, 4, 2), TileConfig(32, 64, 4, 3), TileConfig(128, 32, 8, 2)])
def test_every_tile_shape_is_correct(device, config):
    # The GPU session sweeps these shapes for speed; each must compute the same function.
    batch = make_paged_batch([11, 1, 5], [20, 33, 5], 6, 2, 24, 8, device=device, seed=config.block_m)
    md = batch.metadata
    out = unified_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                            md.block_tables, md.num_seqs, md.max_query_len, 0.3, config=config)
    assert_close(out, paged_attention_reference(batch.query, batch.kv_cache, md, 0.3), torch.float32)


@pytest.mark.parametrize("window", [1, 6, 100])
def test_sliding_window(device, window):
    batch = make_paged_batch([9, 1, 4], [30, 17, 4], 4, 2, 16, 4, device=device, seed=window)
    out, expected = _run(batch, sliding_window=window)
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(device, dtype):
    batch = make_paged_batch(MIXED_Q, MIXED_SEQ, 4, 2, 40, 8, dtype=dtype, device=device, seed=7)
    out, expected = _run(batch, scale=40**-0.5)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], dtype)


def test_strided_query_from_fused_qkv(device):
    # query as the layer hands it over: a view into a [tokens, (q + k + v) heads * dim] buffer.
    batch = make_paged_batch([3, 1], [3, 11], 4, 2, 16, 4, device=device, seed=11)
    tokens = batch.query.shape[0]
    qkv = torch.randn(tokens, (4 + 2 + 2) * 16, device=device)
    qkv[:, : 4 * 16] = batch.query.reshape(tokens, -1)
    query = qkv[:, : 4 * 16].view(tokens, 4, 16)
    md = batch.metadata
    out = unified_attention(query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                            md.num_seqs, md.max_query_len, 0.25)
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, 0.25)
    assert_close(out, expected, torch.float32)


def test_rejects_mismatched_shapes(device):
    batch = make_paged_batch([2], [5], 4, 2, 16, 4, device=device)
    md = batch.metadata
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        unified_attention(batch.query[:, :3], batch.kv_cache, md.query_start_loc, md.seq_lens,
                          md.block_tables, 1, 2, 1.0)
    with pytest.raises(ValueError, match="int32"):
        unified_attention(batch.query, batch.kv_cache, md.query_start_loc.long(), md.seq_lens,
                          md.block_tables, 1, 2, 1.0)
    with pytest.raises(ValueError, match="num_seqs=2"):
        unified_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                          md.block_tables, 2, 2, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_full_size_qwen3_mixed_batch(dtype):
    """W1 shapes for Qwen3-0.6B: 16 q heads, 8 KV heads, head_dim 128, block 16."""
    gen = torch.Generator().manual_seed(0)
    q_lens = [512, 1000] + [1] * 64 + [300]
    seq_lens = [1536, 1000] + torch.randint(100, 2048, (64,), generator=gen).tolist() + [2047]
    batch = make_paged_batch(q_lens, seq_lens, 16, 8, 128, 16, dtype=dtype, device="cuda", pad_tokens=5)
    out, expected = _run(batch, scale=128**-0.5)
    real, pad = batch.real_rows.cuda(), batch.padding_rows.cuda()
    assert_close(out[real], expected[real], dtype)
    assert out[pad].isnan().all()
