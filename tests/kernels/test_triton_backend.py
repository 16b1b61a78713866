"""TritonAttentionBackend end to end (write_kv, then forward) against TorchAttentionBackend."""

from __future__ import annotations

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.attention.backends.triton_backend import TritonAttentionBackend
from tests.kernels.paged_batch import assert_close, make_paged_batch


def _step(backend, batch, sliding_window=None):
    cache = batch.kv_cache.clone()
    backend.write_kv(batch.key, batch.value, cache, batch.metadata.slot_mapping)
    return cache, backend.forward(batch.query, cache, batch.metadata, 0.25, sliding_window)


@pytest.mark.parametrize(
    "q_lens, seq_lens",
    [
        ([4, 1, 0, 6, 1], [10, 21, 0, 6, 3]),  # mixed: unified kernel
        ([1, 1, 0, 1], [40, 3, 0, 300]),  # decode-only: split-KV kernel
    ],
)
@pytest.mark.parametrize("window", [None, 8])
def test_step_matches_torch_backend(device, q_lens, seq_lens, window):
    batch = make_paged_batch(q_lens, seq_lens, 6, 2, 20, 4, device=device, pad_tokens=2, seed=len(q_lens))
    ref_cache, expected = _step(TorchAttentionBackend(), batch, window)
    cache, out = _step(TritonAttentionBackend(num_splits=4), batch, window)
    assert torch.equal(cache, ref_cache)
    real = batch.real_rows.to(device)
    assert_close(out[real], expected[real], torch.float32)


def test_split_kv_switch(device):
    batch = make_paged_batch([1, 1], [300, 90], 4, 2, 16, 8, device=device, seed=4)
    _, split = _step(TritonAttentionBackend(num_splits=2), batch)
    _, plain = _step(TritonAttentionBackend(split_kv=False), batch)
    torch.testing.assert_close(split, plain, atol=2e-6, rtol=2e-6)


def test_decode_splits_depend_only_on_batch_shape():
    backend = TritonAttentionBackend()
    cpu = torch.device("cpu")
    assert backend.decode_splits(256, 8, cpu) == 1
    assert backend.decode_splits(2, 8, cpu) == 32
    assert TritonAttentionBackend(split_kv=False).decode_splits(2, 8, cpu) == 1


@pytest.mark.gpu
def test_full_size_step_bf16():
    q_lens = [700, 1, 1, 1, 256]
    seq_lens = [700, 1500, 33, 2047, 1800]
    batch = make_paged_batch(q_lens, seq_lens, 16, 8, 128, 16, dtype=torch.bfloat16, device="cuda", pad_tokens=7)
    ref_cache, expected = _step(TorchAttentionBackend(), batch)
    cache, out = _step(TritonAttentionBackend(), batch)
    assert torch.equal(cache, ref_cache)
    real = batch.real_rows.cuda()
    assert_close(out[real], expected[real], torch.bfloat16)
