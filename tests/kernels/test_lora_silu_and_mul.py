"""The gate/up LoRA delta fused into SiLU-and-mul against the unfused path (expand, then the
activation), through the real step mapping (padding tokens included); the activation's block
plan covers every token exactly once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from folio.kernels.activation import silu_and_mul_triton
from folio.kernels.lora_expand import lora_expand_triton
from folio.kernels.lora_shrink import block_m, lora_shrink_reference, lora_shrink_triton, sum_splits
from folio.kernels.lora_silu_and_mul import lora_silu_and_mul_reference, lora_silu_and_mul_triton
from folio.lora.mapping import LoRAMappingBuffers
from tests.kernels.test_lora import _case, _stack

# bf16: a last-bit difference in the delta can flip gate's rounding by one step (1/16 at ~8),
# which the product with up (~8) makes 0.5: a relative tolerance of a few bf16 steps.
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (0.1, 4e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "padded", "ranks", "none_fraction"),
                         [(9, 9, [2], 0.0), (13, 16, [4, 8, 3], 0.3), (70, 72, [8, 8], 0.5), (5, 8, [4], 1.0)])
def test_fused_activation_equals_expand_then_activation(device, dtype, tokens, padded, ranks, none_fraction):
    _check_fused(device, dtype, tokens, padded, ranks, none_fraction, k=40, inter=24, r_max=8)


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "padded"), [(1, 1), (61, 64), (1500, 1536)])
def test_fused_activation_at_llama_8b_width_on_gpu(tokens, padded):
    """Llama-3.1-8B's gate/up width (14,336) at rank 16, 8 slots, in bf16, decode to prefill sizes."""
    _check_fused(torch.device("cuda"), torch.bfloat16, tokens, padded, [16] * 8, 0.2, k=256, inter=14336, r_max=16)


def test_fused_activation_sums_kept_partials(device):
    """The fused activation on the shrink's kept split-K partials equals it on their sum."""
    adapters, slots, x = _case(10, 256, [24, 24], [4, 4], 4, seed=7, none_fraction=0.2)
    a, b = _stack(adapters, [24, 24], 256, 4, torch.bfloat16, device)
    mapping = LoRAMappingBuffers(128, 2, device).write(slots.numpy(), 10)
    xd = x.to(device, torch.bfloat16)
    y = (torch.randn(10, 48, generator=torch.Generator().manual_seed(1)) * 3).to(device, torch.bfloat16)
    partials = lora_shrink_triton(xd, a, mapping.sorted_tokens, mapping.blocks, split_k=4, keep_splits=True)
    kept = lora_silu_and_mul_triton(y, partials, b, mapping.sorted_tokens, mapping.act_blocks)
    assert torch.equal(kept, lora_silu_and_mul_triton(y, sum_splits(partials), b, mapping.sorted_tokens, mapping.act_blocks))


def _check_fused(device, dtype, tokens, padded, ranks, none_fraction, k, inter, r_max):
    adapters, slots, x = _case(tokens, k, [inter, inter], ranks, r_max, seed=tokens, none_fraction=none_fraction)
    a, b = _stack(adapters, [inter, inter], k, r_max, dtype, device)
    buffers = LoRAMappingBuffers(max(128, padded), len(ranks), device)
    mapping = buffers.write(slots.numpy(), padded)
    xd = torch.zeros(padded, k, dtype=dtype, device=device)
    xd[:tokens] = x.to(device, dtype)
    y = (torch.randn(padded, 2 * inter, generator=torch.Generator().manual_seed(1)) * 3).to(device, dtype)
    shrunk = lora_shrink_triton(xd, a, mapping.sorted_tokens, mapping.blocks)
    torch.testing.assert_close(shrunk[mapping.token_slots >= 0], lora_shrink_reference(xd, a, mapping.token_slots)[
        mapping.token_slots >= 0], atol=1e-3, rtol=1e-4)
    got = lora_silu_and_mul_triton(y, shrunk, b, mapping.sorted_tokens, mapping.act_blocks)
    # The unfused kernels on the same shrink: equal bit for bit (the fused kernel rounds as they do).
    offsets = torch.tensor([0, inter, 2 * inter], dtype=torch.int32, device=device)
    expanded = lora_expand_triton(y.clone(), shrunk, b, offsets, mapping.sorted_tokens, mapping.blocks, [inter, inter])
    assert torch.equal(got, silu_and_mul_triton(expanded))
    # The torch reference on that shrink. Not on the reference shrink: a last-bit difference
    # of the shrink (float32 sums in another order) flips its bf16 rounding now and then, which
    # moves the delta by a step of one of its terms: past any tolerance somewhere in 21M values.
    want = lora_silu_and_mul_reference(y, shrunk, b, mapping.token_slots)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
    plain = torch.nn.functional.silu(y[:, :inter].float()) * y[:, inter:].float()
    without = torch.cat((slots < 0, torch.ones(padded - tokens, dtype=torch.bool)))
    torch.testing.assert_close(got.float()[without], plain[without], atol=atol, rtol=rtol)  # no delta there
    if none_fraction < 1.0:
        assert not torch.allclose(got.float()[~without], plain[~without], atol=atol, rtol=rtol)


@pytest.mark.parametrize(("tokens", "padded"), [(7, 8), (100, 100), (1500, 1536)])
def test_activation_blocks_cover_every_token_once(tokens, padded):
    rng = np.random.default_rng(tokens)
    slots = rng.integers(-1, 3, tokens)
    buffers = LoRAMappingBuffers(2048, 3, torch.device("cpu"))
    mapping = buffers.write(slots, padded)
    sorted_tokens = mapping.sorted_tokens.numpy()
    covered = np.zeros(padded, dtype=int)
    blocks = mapping.act_blocks
    for slot, start, end in zip(blocks.slots.numpy(), blocks.starts.numpy(), blocks.ends.numpy()):
        if slot < 0:
            continue
        members = sorted_tokens[start : min(start + block_m(padded), end)]
        want = slot if slot < 3 else -1  # slot 3 = max_loras: the tokens without an adapter
        assert all((slots[t] if t < tokens else -1) == want for t in members)
        covered[members] += 1
    assert covered.tolist() == [1] * padded
