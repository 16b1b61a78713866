"""The stacked layout: every slot's A under the base weight as extra output rows, one GEMM for
the base output and every token's shrink under every slot, then the expand reading each token's
own slot's columns into a new output (kernels/lora_expand.py, lora/layers.py). Checked against
the token-by-token specification (x W^T + x A^T B^T * scale), which knows nothing of the layout."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.lora_expand import lora_expand_stacked_reference, lora_expand_stacked_triton, lora_expand_triton
from folio.kernels.lora_shrink import lora_shrink_triton
from folio.kernels.lora_silu_and_mul import lora_silu_and_mul_reference, lora_silu_and_mul_triton
from folio.kernels.lora_expand import ShrinkSource
from folio.lora.mapping import LoRAMappingBuffers
from tests.kernels.test_lora import TOL, _case, _expected, _stack


def _stacked(x, w, a):
    """The stacked GEMM: [tokens, N + slots * W] = x @ [w; a_0; ...; a_{S-1}]^T, rounded once."""
    return x @ torch.cat((w, a.flatten(0, 1))).T


def _setup(device, dtype, tokens, padded, k, shard_sizes, ranks, r_max, none_fraction):
    adapters, slots, x = _case(tokens, k, shard_sizes, ranks, r_max, seed=tokens + k, none_fraction=none_fraction)
    a, b = _stack(adapters, shard_sizes, k, r_max, dtype, device)
    w = (torch.randn(sum(shard_sizes), k, generator=torch.Generator().manual_seed(3)) * 0.2).to(device, dtype)
    mapping = LoRAMappingBuffers(max(128, padded), len(ranks), device).write(slots.numpy(), padded)
    xd = torch.zeros(padded, k, dtype=dtype, device=device)
    xd[:tokens] = x.to(device, dtype)
    all_slots = torch.cat((slots, torch.full((padded - tokens,), -1)))
    return adapters, all_slots, xd, w, a, b, mapping


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "padded", "shard_sizes", "ranks", "none_fraction"), [
    (13, 16, [40, 20, 20], [8, 3, 16], 0.3),  # qkv-like: three shards, padding tokens
    (21, 21, [24], [4, 8], 0.0),  # o_proj-like, every token has an adapter
    (70, 72, [24, 8], [4, 8], 0.5),  # several blocks per slot
    (5, 8, [16], [4], 1.0),  # no token has an adapter: a copy
])
def test_stacked_expand_matches_the_specification(device, dtype, tokens, padded, shard_sizes, ranks, none_fraction):
    adapters, slots, x, w, a, b, mapping = _setup(device, dtype, tokens, padded, 48, shard_sizes, ranks, 16, none_fraction)
    offsets = torch.tensor([0, *torch.tensor(shard_sizes).cumsum(0).tolist()], dtype=torch.int32, device=device)
    y_ext = _stacked(x, w, a)
    n = sum(shard_sizes)
    got = lora_expand_stacked_triton(y_ext, b, offsets, mapping.sorted_tokens, mapping.act_blocks, shard_sizes)
    assert got.shape == (padded, n) and got.is_contiguous()
    expected = _expected(x.float().cpu(), adapters, slots, shard_sizes, (x @ w.T).cpu())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float().cpu(), expected, atol=atol, rtol=rtol)
    without = slots < 0
    assert torch.equal(got.cpu()[without], y_ext[:, :n].cpu()[without]), "tokens without an adapter: the base output"
    ref = lora_expand_stacked_reference(y_ext, b, slots.to(device), shard_sizes)
    torch.testing.assert_close(ref.float().cpu(), expected, atol=atol, rtol=rtol)


def test_stacked_expand_equals_the_shrink_kernel_path_on_the_same_shrink(device):
    """Given the stacked columns as the shrink, the stacked expand is bit for bit the in-place
    expand of that shrink: the layouts differ in where they read, not in what they compute."""
    shard_sizes = [32, 16]
    adapters, slots, x, w, a, b, mapping = _setup(device, torch.bfloat16, 30, 32, 64, shard_sizes, [8, 8, 4], 8, 0.3)
    offsets = torch.tensor([0, 32, 48], dtype=torch.int32, device=device)
    y_ext = _stacked(x, w, a)
    got = lora_expand_stacked_triton(y_ext, b, offsets, mapping.sorted_tokens, mapping.act_blocks, shard_sizes)
    rows = torch.arange(32, device=device)
    shrunk = y_ext[:, 48:].unflatten(1, (3, 16))[rows, mapping.token_slots.clamp(min=0).long()].float()
    y = y_ext[:, :48].clone()
    lora_expand_triton(y, shrunk, b, offsets, mapping.sorted_tokens, mapping.blocks, shard_sizes)
    assert torch.equal(got, y)
    # and the shrink kernel's own result differs from the GEMM's only by the GEMM's bf16 rounding
    kernel = lora_shrink_triton(x, a, mapping.sorted_tokens, mapping.blocks)
    has = mapping.token_slots >= 0
    torch.testing.assert_close(kernel[has], shrunk[has], atol=0.02, rtol=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stacked_activation_equals_the_stacked_expand_then_activation(device, dtype):
    inter = 24
    adapters, slots, x, w, a, b, mapping = _setup(device, dtype, 13, 16, 40, [inter, inter], [4, 8, 3], 8, 0.3)
    y_ext = _stacked(x, w, a)
    got = lora_silu_and_mul_triton(y_ext[:, : 2 * inter], ShrinkSource.stacked(y_ext, 2 * inter, 16), b,
                                   mapping.sorted_tokens, mapping.act_blocks)
    offsets = torch.tensor([0, inter, 2 * inter], dtype=torch.int32, device=device)
    expanded = lora_expand_stacked_triton(y_ext, b, offsets, mapping.sorted_tokens, mapping.act_blocks, [inter, inter])
    plain = torch.nn.functional.silu(expanded[:, :inter].float()).to(dtype).float() * expanded[:, inter:].float()
    atol, rtol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (0.05, 2e-2)}[dtype]
    torch.testing.assert_close(got.float(), plain, atol=atol, rtol=rtol)
    rows = torch.arange(16, device=device)
    shrunk = y_ext[:, 2 * inter:].unflatten(1, (3, 16))[rows, mapping.token_slots.clamp(min=0).long()].float()
    want = lora_silu_and_mul_reference(y_ext[:, : 2 * inter].contiguous(), shrunk, b, mapping.token_slots)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


def test_stacked_rejects_a_wrong_width(device):
    b = torch.zeros(2, 16, 4, device=device)
    offsets = torch.tensor([0, 16], dtype=torch.int32, device=device)
    mapping = LoRAMappingBuffers(128, 2, device).write(torch.tensor([0, 1, -1, 0]).numpy(), 4)
    with pytest.raises(ValueError, match="y_ext"):
        lora_expand_stacked_triton(torch.zeros(4, 16 + 2 * 8, device=device), b, offsets, mapping.sorted_tokens,
                                   mapping.act_blocks, [16])


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 61, 256, 1500])
@pytest.mark.parametrize(("k", "shard_sizes"), [(4096, [4096, 1024, 1024]), (14336, [4096])])
def test_stacked_full_size_on_gpu(tokens, k, shard_sizes):
    """Llama-3.1-8B's qkv and down shapes, 8 slots of rank 16, bf16: the kernel equals the torch
    reference on the same GEMM output bit for bit, and tracks the specification."""
    padded = -(-tokens // 8) * 8
    adapters, slots, x, w, a, b, mapping = _setup(torch.device("cuda"), torch.bfloat16, tokens, padded, k, shard_sizes,
                                                  [16] * 8, 16, 0.2)
    offsets = torch.tensor([0, *torch.tensor(shard_sizes).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    y_ext = _stacked(x, w, a)
    got = lora_expand_stacked_triton(y_ext, b, offsets, mapping.sorted_tokens, mapping.act_blocks, shard_sizes)
    ref = lora_expand_stacked_reference(y_ext, b, slots.cuda(), shard_sizes)
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2 * scale, rtol=0)
