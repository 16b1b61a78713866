"""The split-KV decode kernel: equal to the reference with and without splits, padding untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from folio.attention.backends.torch_ref import paged_attention_reference
from folio.attention.metadata import longest_first
from folio.kernels.paged_attention import TileConfig
from folio.kernels.paged_decode import MAX_SPLITS, PROGRAMS_PER_SM, choose_num_splits, paged_decode
from tests.kernels.paged_batch import assert_close, make_paged_batch

# Contexts from 1 token to several splits' worth; one padding sequence (query_len 0, seq_len 0).
SEQ_LENS = [1, 37, 0, 150, 64, 96]


def _decode_batch(device, seq_lens=SEQ_LENS, num_heads=6, num_kv_heads=2, head_dim=40,
                  block_size=8, dtype=torch.float32, seed=0):
    q_lens = [1 if s > 0 else 0 for s in seq_lens]
    return make_paged_batch(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size,
                            dtype=dtype, device=device, pad_tokens=2, seed=seed)


def _decode(batch, num_splits, sliding_window=None, scale=0.3, min_split_tokens=16, order=None):
    md = batch.metadata
    out = torch.full_like(batch.query, float("nan"))
    paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                 md.num_seqs, scale, sliding_window, num_splits=num_splits,
                 min_split_tokens=min_split_tokens, out=out, order=order)
    return out


def _order(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


@pytest.mark.parametrize("num_splits", [1, 4, 8])
@pytest.mark.parametrize("window", [None, 20])
def test_splits_match_reference(device, num_splits, window):
    batch = _decode_batch(device)
    out = _decode(batch, num_splits, window)
    expected = paged_attention_reference(batch.query, batch.kv_cache, batch.metadata, 0.3, window)
    real, pad = batch.real_rows.to(device), batch.padding_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)
    assert out[pad].isnan().all(), "padding sequences and rows past the batch stay untouched"


def test_split_on_and_off_agree(device):
    # More splits launched than a short sequence uses: surplus programs must exit cleanly and
    # the merge must ignore them (the CUDA-graph case: splits fixed by batch size, not length).
    batch = _decode_batch(device, seq_lens=[3, 200, 17, 64], num_heads=4, num_kv_heads=1,
                          head_dim=20, block_size=16, seed=5)
    real = batch.real_rows.to(device)
    one = _decode(batch, 1)[real]
    many = _decode(batch, 16, min_split_tokens=32)[real]
    torch.testing.assert_close(one, many, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size",
    [(4, 4, 16, 1), (4, 1, 20, 32), (12, 4, 32, 2)],  # MHA, MQA, GQA 3
)
def test_head_layouts(device, num_heads, num_kv_heads, head_dim, block_size):
    batch = _decode_batch(device, [5, 70, 33], num_heads, num_kv_heads, head_dim, block_size, seed=2)
    out = _decode(batch, 2)
    expected = paged_attention_reference(batch.query, batch.kv_cache, batch.metadata, 0.3)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("how", ["longest_first", "reversed"])
def test_program_order_changes_nothing(device, num_splits, how):
    # Grid rows take the sequences through the order: each sequence's rows equal the batch-order
    # run's, bit for bit, and the padding sequence and rows stay untouched.
    batch = _decode_batch(device, seed=4)
    lens = np.asarray(batch.metadata.seq_lens_cpu)
    order = longest_first(lens) if how == "longest_first" else np.arange(len(lens))[::-1].copy()
    out = _decode(batch, num_splits, order=_order(order.tolist(), device))
    base = _decode(batch, num_splits)
    real, pad = batch.real_rows.to(device), batch.padding_rows.to(device)
    assert torch.equal(out[real], base[real])
    assert out[pad].isnan().all()
    expected = paged_attention_reference(batch.query, batch.kv_cache, batch.metadata, 0.3)
    assert_close(out[real], expected[real], torch.float32)


def test_rejects_bad_orders(device):
    batch = _decode_batch(device, [4, 9])
    md = batch.metadata
    for bad in (_order([0], device), _order([[0, 1]], device), torch.tensor([1, 0], device=device)):
        with pytest.raises(ValueError, match="order"):
            paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                         md.block_tables, 2, 1.0, order=bad)


def test_longest_first():
    assert longest_first(np.array([5, 0, 9, 5, 1], dtype=np.int32)).tolist() == [2, 0, 3, 4, 1]
    assert longest_first(np.zeros(3, dtype=np.int32)).tolist() == [0, 1, 2]  # padding: batch order
    assert longest_first(np.array([], dtype=np.int32)).dtype == np.int32


@pytest.mark.parametrize("config", [TileConfig(16, 16, 4, 2), TileConfig(32, 128, 8, 4)])
def test_every_tile_shape_is_correct(device, config):
    batch = _decode_batch(device, [9, 130, 64], num_heads=4, num_kv_heads=2, head_dim=16, seed=1)
    md = batch.metadata
    out = paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                       md.num_seqs, 0.3, num_splits=2, min_split_tokens=16, config=config)
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, 0.3)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)


def test_bfloat16(device):
    batch = _decode_batch(device, dtype=torch.bfloat16, seed=9)
    out = _decode(batch, 4, scale=40**-0.5)
    expected = paged_attention_reference(batch.query, batch.kv_cache, batch.metadata, 40**-0.5)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], torch.bfloat16)


def test_rejects_bad_split_counts(device):
    batch = _decode_batch(device, [4])
    md = batch.metadata
    for bad in (0, 3, 2 * MAX_SPLITS):
        with pytest.raises(ValueError, match="num_splits"):
            paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                         md.block_tables, 1, 1.0, num_splits=bad)


def test_split_heuristic():
    sms, want = 132, PROGRAMS_PER_SM * 132
    assert choose_num_splits(256, 8, sms) == 1  # W1 at full batch: 2048 programs, no split
    assert choose_num_splits(66, 8, sms) == 1  # 528 programs already fill the SMs
    for seqs in (1, 2, 5, 16, 32, 65):
        splits = choose_num_splits(seqs, 8, sms)
        assert splits & (splits - 1) == 0 and 1 < splits <= MAX_SPLITS
        assert seqs * 8 * splits >= want or splits == MAX_SPLITS
        assert seqs * 8 * splits // 2 < want  # the smallest power of two that fills the SMs


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [4, 256])
def test_full_size_qwen3_decode(num_seqs):
    gen = torch.Generator().manual_seed(num_seqs)
    seq_lens = torch.randint(100, 2048, (num_seqs,), generator=gen).tolist()
    batch = make_paged_batch([1] * num_seqs, seq_lens, 16, 8, 128, 16, dtype=torch.bfloat16,
                             device="cuda", pad_tokens=3)
    expected = paged_attention_reference(batch.query, batch.kv_cache, batch.metadata, 128**-0.5)
    real = batch.real_rows.cuda()
    splits = choose_num_splits(num_seqs, 8, torch.cuda.get_device_properties(0).multi_processor_count)
    order = _order(longest_first(np.asarray(batch.metadata.seq_lens_cpu)).tolist(), "cuda")
    for num_splits in {1, splits}:
        out = _decode(batch, num_splits, scale=128**-0.5, min_split_tokens=256)
        assert_close(out[real], expected[real], torch.bfloat16)
        ordered = _decode(batch, num_splits, scale=128**-0.5, min_split_tokens=256, order=order)
        assert torch.equal(ordered[real], out[real])
