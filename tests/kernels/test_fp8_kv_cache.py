"""FP8 KV cache: the cache-write kernel quantizes and both attention kernels dequantize exactly
as the torch reference does (K / k_scale, V / v_scale in e4m3, scales folded back on read)."""

from __future__ import annotations

import pytest
import torch

from folio.attention.backends.torch_ref import paged_attention_reference
from folio.kernels.paged_attention import unified_attention
from folio.kernels.paged_decode import paged_decode
from folio.kernels.reshape_and_cache import (
    FP8_KV_DTYPE,
    dequantize_kv_reference,
    reshape_and_cache,
    reshape_and_cache_reference,
)
from tests.kernels.paged_batch import assert_close, make_paged_batch

K_SCALE, V_SCALE = 0.02, 0.005  # K and V are ~N(0, 1): these push codes up to ~+-448 (saturating)


def _fp8_batch(device, q_lens, seq_lens, dtype=torch.float32, seed=0):
    batch = make_paged_batch(q_lens, seq_lens, 6, 2, 40, 8, dtype=dtype, device=device, pad_tokens=2, seed=seed)
    # The random cache, as an FP8 cache holding it would (codes of value / scale).
    k = (batch.kv_cache[0].float() / K_SCALE).clamp(-448, 448)
    v = (batch.kv_cache[1].float() / V_SCALE).clamp(-448, 448)
    batch.kv_cache = torch.stack([k, v]).to(FP8_KV_DTYPE)
    return batch


def test_write_quantizes_like_the_reference(device):
    batch = _fp8_batch(device, [3, 1, 5], [3, 9, 20])
    md = batch.metadata
    got, expected = batch.kv_cache.clone(), batch.kv_cache.clone()
    reshape_and_cache(batch.key, batch.value, got, md.slot_mapping, K_SCALE, V_SCALE)
    reshape_and_cache_reference(batch.key, batch.value, expected, md.slot_mapping, K_SCALE, V_SCALE)
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), "bit-exact e4m3 codes"
    slot = int(md.slot_mapping[0])
    stored = got[0].view(-1, 2, 40)[slot]  # [kv_heads, dim]
    # e4m3 keeps 3 mantissa bits: within 1/16 relative, plus the subnormal step near zero.
    torch.testing.assert_close(dequantize_kv_reference(stored, K_SCALE), batch.key[0].float(), atol=1e-3, rtol=0.07)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_reads_fp8(device, num_splits):
    seq_lens = [1, 37, 0, 150, 64]
    batch = _fp8_batch(device, [1 if s else 0 for s in seq_lens], seq_lens)
    md = batch.metadata
    out = torch.full_like(batch.query, float("nan"))
    paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs,
                 0.3, num_splits=num_splits, min_split_tokens=16, out=out, k_scale=K_SCALE, v_scale=V_SCALE)
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, 0.3, k_scale=K_SCALE, v_scale=V_SCALE)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)


def test_unified_reads_fp8(device):
    batch = _fp8_batch(device, [5, 1, 17], [5, 30, 40], seed=3)
    md = batch.metadata
    out = unified_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables,
                            md.num_seqs, md.max_query_len, 0.3, k_scale=K_SCALE, v_scale=V_SCALE)
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, 0.3, k_scale=K_SCALE, v_scale=V_SCALE)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)
    unscaled = paged_attention_reference(batch.query, batch.kv_cache, md, 0.3)
    assert not torch.allclose(unscaled[real], expected[real]), "the scales matter"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [1, 8])
def test_half_queries_over_an_fp8_cache(dtype, num_splits):
    """On CUDA the decode kernel widens the e4m3 bytes itself (inline PTX, four at a time) and
    attends in float16 with q pre-scaled: equal to the reference within the query dtype's error,
    for bf16 and fp16 queries, split or not, at a head size that pads (40 -> 64)."""
    seq_lens = [300, 1, 4000, 77]
    batch = _fp8_batch("cuda", [1] * 4, seq_lens, dtype=dtype)
    md = batch.metadata
    out = paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs,
                       0.1, num_splits=num_splits, k_scale=K_SCALE, v_scale=V_SCALE)
    expected = paged_attention_reference(batch.query, batch.kv_cache, md, 0.1, k_scale=K_SCALE, v_scale=V_SCALE)
    real = batch.real_rows.to("cuda")
    assert_close(out[real], expected[real], dtype)
