"""Qwen3's q/k head norms and rotary in one kernel: the same values as the separate kernels
(RMSNorm per head, then rotary; bit-equal in the interpreter, within one bf16 step on a GPU,
whose variance sum may be ordered differently), in place in views of a fused qkv output, with
partial rotary, GQA head counts that are not powers of two, and the torch reference within
rounding; with the cache, the K/V store equals reshape_and_cache's."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.qk_norm_rope import qk_norm_rope_reference, qk_norm_rope_triton
from folio.kernels.rms_norm import rms_norm_triton
from folio.kernels.rotary import rotary_triton
from folio.layers.rotary_embedding import get_rope


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "partial"), [(4, 2, 32, 1.0), (6, 3, 64, 0.5), (5, 1, 16, 1.0)])
def test_one_kernel_equals_the_separate_ones(device, dtype, heads, kv_heads, head_dim, partial):
    _check_against_separate_kernels(device, dtype, heads, kv_heads, head_dim, partial, tokens=7)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 256, 4096])
def test_qwen3_shapes_on_gpu(tokens):
    """Qwen3-0.6B's attention (16 q heads, 8 kv heads of 128) in bf16."""
    _check_against_separate_kernels(torch.device("cuda"), torch.bfloat16, 16, 8, 128, 1.0, tokens=tokens)


def _check_against_separate_kernels(device, dtype, heads, kv_heads, head_dim, partial, tokens):
    gen = torch.Generator().manual_seed(heads * head_dim + tokens)
    rope = get_rope(head_dim, 256, {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial})
    cache = rope.cos_sin_cache.to(device)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen) * 2).to(device, dtype)
    positions = torch.randint(0, 256, (tokens,), generator=gen).to(device)
    q_w = (torch.rand(head_dim, generator=gen) + 0.5).to(device, dtype)
    k_w = (torch.rand(head_dim, generator=gen) + 0.5).to(device, dtype)

    def split(t):
        return t.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)

    fused = qkv.clone()
    q, k, v = split(fused)
    qk_norm_rope_triton(q, k, positions, cache, head_dim, q_w, k_w, 1e-6, 1e-5)
    q_sep, k_sep, _ = split(qkv.clone())
    qn = rms_norm_triton(q_sep.reshape(tokens, heads, head_dim), q_w, 1e-6).reshape(tokens, -1)
    kn = rms_norm_triton(k_sep.reshape(tokens, kv_heads, head_dim), k_w, 1e-5).reshape(tokens, -1)
    rotary_triton(qn, kn, positions, cache, head_dim)
    if device.type == "cpu":  # the interpreter sums in one order: bit-equal
        assert torch.equal(q, qn) and torch.equal(k, kn)
    else:  # a GPU may order the variance's sum differently from rms_norm.py: a rare 1-step
        # difference in a normalized value, which the rotation mixes into its pair: up to one
        # step of the pair's larger magnitude (1/64 at 2-4, measured 4 of 8.4M elements on H100)
        step = dict(atol=2**-5, rtol=2**-7) if dtype != torch.float32 else dict(atol=1e-6, rtol=1e-6)
        for got, want in ((q, qn), (k, kn)):
            torch.testing.assert_close(got, want, **step)
            assert (got != want).float().mean().item() < 1e-4  # rare, not a different rounding
    assert torch.equal(v, split(qkv)[2])  # v untouched
    q_ref, k_ref = qk_norm_rope_reference(*split(qkv.clone())[:2], positions, cache, head_dim, q_w, k_w, 1e-6, 1e-5)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(q.float(), q_ref.float(), **tol)
    torch.testing.assert_close(k.float(), k_ref.float(), **tol)


@pytest.mark.parametrize("norm", [True, False], ids=["qk-norm", "rotary-only"])
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float8_e4m3fn])
def test_kv_cache_write_equals_reshape_and_cache(device, cache_dtype, norm):
    """With the cache given, the kernel also stores the rotated K and V at their slots (slot -1:
    nothing): the same cache as normalizing + rotating, then reshape_and_cache."""
    _check_kv_write(device, cache_dtype, norm, torch.float16, 6, 4, 2, 32, torch.tensor([5, 0, -1, 9, 2, 13]))
    _check_kv_write(device, cache_dtype, norm, torch.float16, 3, 3, 1, 16, torch.tensor([7, -1, 1]))  # one KV head


@pytest.mark.gpu
@pytest.mark.parametrize("norm", [True, False], ids=["qwen3-0.6b", "llama-3.1-8b"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_kv_cache_write_at_real_shapes_on_gpu(cache_dtype, norm):
    heads, kv_heads = (16, 8) if norm else (32, 8)
    slots = torch.randperm(4 * 16 * 16, generator=torch.Generator().manual_seed(0))[:300]
    slots[::7] = -1  # padding rows
    _check_kv_write(torch.device("cuda"), cache_dtype, norm, torch.bfloat16, 300, heads, kv_heads, 128, slots, blocks=64)


def _check_kv_write(device, cache_dtype, norm, dtype, tokens, heads, kv_heads, head_dim, slots, blocks=4):
    from folio.kernels.qk_norm_rope import KVWrite
    from folio.kernels.reshape_and_cache import reshape_and_cache

    gen = torch.Generator().manual_seed(3)
    block_size = 4 if blocks == 4 else 16
    rope = get_rope(head_dim, 512, {"rope_type": "default", "rope_theta": 10000.0})
    cache = rope.cos_sin_cache.to(device)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(device, dtype)
    positions = torch.arange(tokens).to(device)
    slots = slots.to(device)
    w = (torch.rand(head_dim, generator=gen) + 0.5).to(device, dtype) if norm else None
    caches = [torch.zeros(2, blocks, block_size, kv_heads, head_dim, device=device).to(cache_dtype) for _ in range(2)]
    outs = []
    for fused, kv_cache in zip((True, False), caches):
        q, k, v = qkv.clone().split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
        write = KVWrite(v, kv_cache, slots, 0.5, 2.0) if fused else None
        if fused:
            qk_norm_rope_triton(q, k, positions, cache, head_dim, w, w, 1e-6, 1e-6, cache=write)
        elif norm:
            qk_norm_rope_triton(q, k, positions, cache, head_dim, w, w, 1e-6, 1e-6)
        else:
            rotary_triton(q, k, positions, cache, head_dim)
        if not fused:
            reshape_and_cache(k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim), kv_cache, slots, 0.5, 2.0)
        outs.append((q, k))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))
    assert caches[0].view(torch.uint8).any()
