"""The step's token -> slot mapping, as the persistent buffers hold it, drives the kernels right.

Written the way the runner writes it (padded to a graph bucket, and rewritten by a later step
with fewer adapters over the same buffers), the mapping must make the Triton kernels (Triton's
interpreter on the CPU) add exactly what the torch path adds from the per-token slots.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from folio.kernels.lora_expand import lora_expand_reference, lora_expand_triton
from folio.kernels.lora_shrink import lora_shrink_reference, lora_shrink_triton
from folio.lora.mapping import LoRAMappingBuffers

SLOTS, K, SIZES, R = 3, 24, [16, 8], 8


def _kernels(mapping, x, a, b, y):
    offsets = torch.tensor([0, *np.cumsum(SIZES)], dtype=torch.int32)
    shrunk = lora_shrink_triton(x, a, mapping.sorted_tokens, mapping.blocks)
    return lora_expand_triton(y.clone(), shrunk, b, offsets, mapping.sorted_tokens, mapping.blocks, SIZES)


def _reference(mapping, x, a, b, y):
    slots = mapping.token_slots
    return lora_expand_reference(y.clone(), lora_shrink_reference(x, a, slots), b, slots, SIZES)


@pytest.mark.parametrize("padded", [40, 48])
def test_buffers_written_step_after_step(padded):
    gen = torch.Generator().manual_seed(padded)
    a = torch.randn(SLOTS, len(SIZES) * R, K, generator=gen)
    b = torch.randn(SLOTS, sum(SIZES), R, generator=gen)
    buffers = LoRAMappingBuffers(max_num_tokens=64, max_loras=SLOTS, device=torch.device("cpu"))
    rng = np.random.default_rng(padded)
    for step_slots in (rng.integers(-1, SLOTS, 37), np.array([-1, 2, -1, -1, 2, 0]), np.full(5, -1)):
        mapping = buffers.write(step_slots, padded)
        assert mapping.token_slots.tolist() == step_slots.tolist() + [-1] * (padded - len(step_slots))
        x = torch.randn(padded, K, generator=gen)
        y = torch.randn(padded, sum(SIZES), generator=gen)
        torch.testing.assert_close(_kernels(mapping, x, a, b, y), _reference(mapping, x, a, b, y), atol=1e-4, rtol=1e-4)
    assert not buffers.write(np.full(5, -1), 8).any_adapter
    assert buffers.write(np.full(5, -1), 8, for_graph=True).any_adapter
