"""Rotary embedding (neox) in place on q and k, against the torch reference and the layer."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.rotary import apply_rotary, rotary_reference, rotary_triton
from folio.layers.rotary_embedding import RotaryEmbedding, compute_inv_freq


def _qkv(device, tokens, q_heads, kv_heads, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=gen).to(device=device, dtype=dtype)
    q = qkv[:, : q_heads * head_dim]  # strided views, as the layer slices them
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim]
    return qkv, q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, rot_dim", [(32, 32), (40, 40), (64, 32)])  # full, odd half, partial
def test_matches_reference(device, dtype, head_dim, rot_dim):
    qkv, q, k = _qkv(device, 6, 3, 1, head_dim, dtype)
    positions = torch.tensor([0, 5, 2, 99, 17, 17], device=device)
    cache = torch.randn(100, rot_dim).to(device=device, dtype=dtype)
    expected = qkv.clone()
    eq, ek = expected[:, : q.shape[1]], expected[:, q.shape[1] : q.shape[1] + k.shape[1]]
    rotary_triton(q, k, positions, cache, head_dim)
    rotary_reference(eq, ek, positions, cache, head_dim)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(qkv, expected, atol=tol, rtol=tol)
    v_cols = slice(q.shape[1] + k.shape[1], None)
    assert torch.equal(qkv[:, v_cols], expected[:, v_cols]), "v must be untouched"
    if rot_dim < head_dim:  # channels past rot_dim pass through
        before = _qkv(device, 6, 3, 1, head_dim, dtype)[0]
        pass_through = before.view(6, 5, head_dim)[:, :4, rot_dim:]
        assert torch.equal(qkv.view(6, 5, head_dim)[:, :4, rot_dim:], pass_through)


def test_agrees_with_layer_rotary_embedding(device):
    head_dim, max_pos = 32, 64
    inv_freq, scaling = compute_inv_freq({"rope_type": "default", "rope_theta": 10000.0}, head_dim, max_pos)
    rope = RotaryEmbedding(head_dim, head_dim, max_pos, inv_freq, scaling).to(device)
    _, q, k = _qkv(device, 5, 4, 2, head_dim, torch.float32, seed=3)
    positions = torch.tensor([1, 2, 3, 40, 63], device=device)
    want_q, want_k = rope(positions.cpu(), q.cpu(), k.cpu())
    rotary_triton(q, k, positions, rope.cos_sin_cache.to(device), head_dim)
    torch.testing.assert_close(q.cpu(), want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k.cpu(), want_k, atol=1e-5, rtol=1e-5)


def test_dispatch_on_cpu_is_the_reference():
    _, q, k = _qkv("cpu", 3, 2, 1, 16, torch.float32)
    _, q2, k2 = _qkv("cpu", 3, 2, 1, 16, torch.float32)
    cache, positions = torch.randn(8, 16), torch.tensor([0, 3, 7])
    apply_rotary(q, k, positions, cache, 16)
    rotary_reference(q2, k2, positions, cache, 16)
    assert torch.equal(q, q2) and torch.equal(k, k2)


def test_rejects_bad_inputs(device):
    _, q, k = _qkv(device, 3, 2, 1, 16, torch.float32)
    positions = torch.tensor([0, 1, 2], device=device)
    with pytest.raises(ValueError, match="rot_dim"):
        rotary_triton(q, k, positions, torch.randn(8, 32, device=device), 16)
    with pytest.raises(ValueError, match="positions"):
        rotary_triton(q, k, positions.float(), torch.randn(8, 16, device=device), 16)


@pytest.mark.gpu
def test_full_size_qwen3_bf16():
    qkv, q, k = _qkv("cuda", 4096, 16, 8, 128, torch.bfloat16)
    positions = torch.randint(0, 4096, (4096,), device="cuda")
    cache = torch.randn(4096, 128, device="cuda").to(torch.bfloat16)
    expected = qkv.clone()
    rotary_triton(q, k, positions, cache, 128)
    rotary_reference(expected[:, : 16 * 128], expected[:, 16 * 128 : 24 * 128], positions, cache, 128)
    assert torch.equal(qkv, expected), "same rounding steps as the torch path: bitwise equal"
