"""The prefill attention kernel against the torch reference: varlen chunks on cached context."""

from __future__ import annotations

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend, paged_attention_reference
from folio.attention.backends.triton_backend import TritonAttentionBackend
from folio.kernels.paged_attention import TileConfig
from folio.kernels.prefill_attention import prefill_attention
from tests.kernels.paged_batch import assert_close, assert_long_rows_only, make_paged_batch

SMALL = TileConfig(32, 16, 4, 2)  # small tiles: the interpreter's cost grows with tile area


def _run(batch, config=SMALL, scale=0.3, sliding_window=None, min_query_len=0):
    md = batch.metadata
    out = torch.full_like(batch.query, float("nan"))  # poison: every row it owns must be written
    prefill_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                      md.num_seqs, scale, sliding_window, out=out, config=config, min_query_len=min_query_len)
    return out, paged_attention_reference(batch.query, batch.kv_cache, md, scale, sliding_window)


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size",
    [(4, 2, 32, 8), (8, 2, 32, 16), (3, 1, 20, 4), (6, 2, 32, 1), (2, 2, 16, 128)],
    # GQA 2 (Qwen3), GQA 4 (Llama-3), MQA + odd head_dim, GQA 3, MHA
)
def test_chunks_on_context_match_reference(device, num_heads, num_kv_heads, head_dim, block_size):
    # A chunk on cached context, a whole prompt, a decode, a padding sequence, a chunk whose
    # context is not a multiple of the tile (so diagonal tiles straddle it), and padding rows.
    batch = make_paged_batch([40, 23, 1, 0, 17], [45, 23, 60, 0, 70], num_heads, num_kv_heads, head_dim,
                             block_size, dtype=torch.bfloat16, device=device, pad_tokens=2, seed=block_size)
    out, expected = _run(batch)
    real, pad = batch.real_rows.to(device), batch.padding_rows.to(device)
    assert_close(out[real], expected[real], torch.bfloat16)
    assert out[pad].isnan().all(), "rows owned by no sequence must be left untouched"


@pytest.mark.parametrize("config", [TileConfig(16, 16, 4, 1), TileConfig(64, 32, 4, 3), TileConfig(32, 64, 8, 2)])
def test_every_tile_shape_is_correct(device, config):
    batch = make_paged_batch([33, 1, 9], [70, 20, 9], 4, 2, 16, 4, dtype=torch.float16, device=device,
                             seed=config.block_m)
    out, expected = _run(batch, config)
    assert_close(out, expected, torch.float16)


@pytest.mark.parametrize("window", [1, 7, 100])
def test_sliding_window(device, window):
    batch = make_paged_batch([30, 4], [50, 4], 4, 2, 16, 4, dtype=torch.bfloat16, device=device, seed=window)
    out, expected = _run(batch, sliding_window=window)
    assert_close(out, expected, torch.bfloat16)


def test_short_sequences_are_left_to_another_kernel(device):
    batch = make_paged_batch([20, 1, 3, 12], [40, 9, 3, 12], 4, 2, 16, 8, dtype=torch.bfloat16,
                             device=device, seed=5)
    out, expected = _run(batch, min_query_len=12)
    assert_long_rows_only(out, expected, batch.metadata, 12)


def test_rejects_float32_and_bad_shapes(device):
    batch = make_paged_batch([2], [5], 4, 2, 16, 4, device=device)
    md = batch.metadata
    args = (md.query_start_loc, md.seq_lens, md.block_tables, 1, 1.0)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        prefill_attention(batch.query, batch.kv_cache, *args)
    half = batch.query.bfloat16()
    with pytest.raises(ValueError, match="kv_cache dtype"):
        prefill_attention(half, batch.kv_cache, *args)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        prefill_attention(half[:, :3], batch.kv_cache.bfloat16(), *args)


def test_backend_routes_long_chunks_to_the_prefill_kernel(device, monkeypatch):
    import folio.attention.backends.triton_backend as tb

    monkeypatch.setattr(tb, "PREFILL_MIN_QUERY_LEN", 16)
    configs = []
    real = tb.prefill_attention

    def spy(*args, config, **kwargs):
        configs.append(config)
        return real(*args, **kwargs, config=SMALL)  # small tiles for the interpreter

    monkeypatch.setattr(tb, "prefill_attention", spy)
    batch = make_paged_batch([20, 1], [50, 9], 4, 2, 16, 8, dtype=torch.bfloat16, device=device, seed=2)
    cache = batch.kv_cache.clone()
    TorchAttentionBackend().write_kv(batch.key, batch.value, cache, batch.metadata.slot_mapping)
    out = TritonAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25)
    expected = TorchAttentionBackend().forward(batch.query, cache, batch.metadata, 0.25)
    assert len(configs) == 1 and configs[0].block_m == 128  # a long chunk leads: tall tiles
    assert_close(out, expected, torch.bfloat16)


def test_backend_tile_choice():
    md = make_paged_batch([300] + [1] * 20, [300] + [40] * 20, 4, 2, 16, 8).metadata
    backend = TritonAttentionBackend()
    assert backend.prefill_config(torch.bfloat16, 128, 2, md).block_m == 64  # one chunk among decodes
    few = make_paged_batch([300, 1], [300, 40], 4, 2, 16, 8).metadata
    assert backend.prefill_config(torch.bfloat16, 128, 2, few).block_m == 128
    short = make_paged_batch([8, 1], [20, 40], 4, 2, 16, 8).metadata
    assert backend.prefill_config(torch.bfloat16, 128, 2, short) is None  # 16 rows: unified kernel
    assert backend.prefill_config(torch.float32, 128, 2, few) is None
    assert backend.prefill_config(torch.bfloat16, 256, 2, few) is None
    assert TritonAttentionBackend(prefill_kernel=False).prefill_config(torch.bfloat16, 128, 2, few) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "q_lens, seq_lens",
    [
        ([8192], [8192]),  # the first chunk of a long prompt
        ([4096], [20000]),  # a later chunk on 15,904 cached tokens
        ([700, 1, 1, 256, 1000], [700, 1500, 33, 1800, 1000]),  # mixed batch
    ],
)
@pytest.mark.parametrize("num_heads", [16, 32])  # Qwen3-0.6B (GQA 2), Llama-3.1-8B (GQA 4)
def test_full_size(dtype, q_lens, seq_lens, num_heads):
    """8 KV heads, head_dim 128, block 16, default tiles."""
    batch = make_paged_batch(q_lens, seq_lens, num_heads, 8, 128, 16, dtype=dtype, device="cuda", pad_tokens=5)
    out, expected = _run(batch, config=None, scale=128**-0.5)
    real, pad = batch.real_rows.cuda(), batch.padding_rows.cuda()
    assert_close(out[real], expected[real], dtype)
    assert out[pad].isnan().all()


@pytest.mark.gpu
def test_full_size_w1_mixed_step_with_mixed_tiles():
    """W1's mixed step (a chunk among many decodes) with the 64-row tiles the backend picks."""
    from folio.attention.backends.triton_backend import MIXED_PREFILL_CONFIG

    gen = torch.Generator().manual_seed(1)
    q_lens = [2048] + [1] * 200
    seq_lens = [4096] + torch.randint(100, 2048, (200,), generator=gen).tolist()
    batch = make_paged_batch(q_lens, seq_lens, 16, 8, 128, 16, dtype=torch.bfloat16, device="cuda", pad_tokens=3)
    out, expected = _run(batch, config=MIXED_PREFILL_CONFIG, scale=128**-0.5)
    real, pad = batch.real_rows.cuda(), batch.padding_rows.cuda()
    assert_close(out[real], expected[real], torch.bfloat16)
    assert out[pad].isnan().all()


def test_window_rows_with_only_negative_scores(device):
    """Rows whose first key tile lies wholly before their window see no key there; their running
    max must stay -inf (not 0), or fp16 probabilities of scores far below 0 round to zero."""
    batch = make_paged_batch([32], [32], 1, 1, 16, 4, dtype=torch.float16, device=device, seed=3)
    batch.query.abs_()  # q . k < 0 for every key: q > 0, k < 0
    batch.kv_cache[0].copy_(-(batch.kv_cache[0].abs() + 8))  # scores near -35
    out, expected = _run(batch, sliding_window=8)  # rows 24..31 see nothing in keys 0..15
    assert_close(out, expected, torch.float16)
