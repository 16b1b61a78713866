"""reshape_and_cache: every real slot written exactly, padding slots and other slots untouched."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_reference


def _case(device, num_tokens, heads, dim, block_size, num_blocks, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(num_tokens, heads, dim, generator=gen).to(device=device, dtype=dtype)
    value = torch.randn(num_tokens, heads, dim, generator=gen).to(device=device, dtype=dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[: num_tokens // 3]] = -1  # padding tokens
    return key, value, slots.to(device)


@pytest.mark.parametrize("heads, dim, block_size", [(3, 20, 4), (2, 128, 16), (1, 40, 1)])
def test_matches_reference_and_leaves_other_slots(device, heads, dim, block_size):
    key, value, slots = _case(device, 11, heads, dim, block_size, num_blocks=12)
    cache = torch.full((2, 12, block_size, heads, dim), float("nan"), device=device)
    expected = cache.clone()
    reshape_and_cache(key, value, cache, slots)
    reshape_and_cache_reference(key, value, expected, slots)
    assert torch.equal(cache.isnan(), expected.isnan()), "only the mapped slots may be written"
    assert torch.equal(cache.nan_to_num(), expected.nan_to_num())
    written = cache[0].view(-1, heads, dim)[slots[slots >= 0]]
    assert not written.isnan().any()


def test_strided_views_and_dtype_cast(device):
    # K/V as views into a fused qkv buffer, stored into a bf16 cache.
    tokens, heads, dim = 7, 2, 16
    qkv = torch.randn(tokens, (4 + heads + heads) * dim, device=device)
    key = qkv[:, 4 * dim : (4 + heads) * dim].view(tokens, heads, dim)
    value = qkv[:, (4 + heads) * dim :].view(tokens, heads, dim)
    slots = torch.tensor([5, -1, 0, 9, 2, -1, 12], device=device)
    cache = torch.zeros(2, 4, 4, heads, dim, dtype=torch.bfloat16, device=device)
    expected = cache.clone()
    reshape_and_cache(key, value, cache, slots)
    reshape_and_cache_reference(key, value, expected, slots)
    torch.testing.assert_close(cache.float(), expected.float(), atol=1e-2, rtol=1e-2)


def test_padded_key_rows_past_slot_mapping_are_ignored(device):
    key, value, slots = _case(device, 8, 2, 16, 4, num_blocks=4)
    cache = torch.zeros(2, 4, 4, 2, 16, device=device)
    expected = cache.clone()
    reshape_and_cache(key, value, cache, slots[:5])
    reshape_and_cache_reference(key, value, expected, slots[:5])
    assert torch.equal(cache, expected)


def test_rejects_bad_inputs(device):
    key, value, slots = _case(device, 4, 2, 16, 4, num_blocks=2)
    cache = torch.zeros(2, 2, 4, 2, 16, device=device)
    with pytest.raises(ValueError, match="int64"):
        reshape_and_cache(key, value, cache, slots.int())
    with pytest.raises(ValueError, match="key must be"):
        reshape_and_cache(key[:, :1], value, cache, slots)
    with pytest.raises(ValueError, match="slot_mapping has"):
        reshape_and_cache(key[:2], value[:2], cache, slots)
