"""The stacked layout layer by layer: the same adapters in the same slots give the same output
stacked (A under the base weight) and unstacked (the shrink kernel path), for a merged QKV
layer with a bias, a merged gate/up layer through silu_and_mul and a row-parallel layer with a
bias; with adapters (slots mixed with base-only tokens, padding), under a graph-capture mapping,
and in a step without adapters. Float32 on the CPU, the torch references and (kernels) the
Triton kernels through the interpreter."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import folio.lora.layers as layers
from folio.layers.linear import MergedColumnLinear, QKVLinear, RowParallelLinear
from folio.lora.adapter import LoRAModuleWeights
from folio.lora.mapping import LoRAMappingBuffers

SLOTS, RANK, HIDDEN = 3, 8, 64


def _wrapped(kind, stacked, buffers, monkeypatch):
    monkeypatch.setenv("FOLIO_LORA_STACKED", stacked)
    gen = torch.Generator().manual_seed(1)
    if kind == "qkv":
        base, names = QKVLinear(HIDDEN, 8, 4, 2, bias=True, prefix="m.qkv_proj"), ("q_proj", "k_proj", "v_proj")
    elif kind == "gate_up":
        base, names = MergedColumnLinear(HIDDEN, [48, 48], ("gate", "up"), prefix="m.gate_up_proj"), ("gate_proj", "up_proj")
    else:
        base, names = RowParallelLinear(HIDDEN, 40, bias=True, prefix="m.o_proj"), ("o_proj",)
    for p in base.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    wrapper = layers.LoRALinear(base, names, SLOTS, RANK, lambda: buffers.current, torch.float32)
    for slot, rank in enumerate((3, 8, 5)):
        modules = {f"m.{name}": LoRAModuleWeights(torch.randn(rank, HIDDEN, generator=gen) * 0.2,
                                                  torch.randn(size, rank, generator=gen) * 0.2)
                   for name, size in zip(names, base.output_partition_sizes)}
        wrapper.set_slot(slot, types.SimpleNamespace(modules=modules), "m")
    return wrapper


@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("kind", ["qkv", "gate_up", "row"])
def test_stacked_equals_unstacked(kind, kernels, monkeypatch):
    if kernels:
        import folio.lora.delta as delta

        monkeypatch.setattr(layers, "use_triton_for", lambda x: True)
        monkeypatch.setattr(delta, "use_triton_for", lambda x: True)
    buffers = LoRAMappingBuffers(256, SLOTS, torch.device("cpu"))
    plain, stacked = _wrapped(kind, "0", buffers, monkeypatch), _wrapped(kind, "1", buffers, monkeypatch)
    assert plain.stacked_weight is None and stacked.stacked_weight is not None
    if kind != "gate_up":  # the bias shares the stacked storage
        assert stacked.base_layer.bias.data_ptr() == stacked.stacked_bias.data_ptr()
    forward = (lambda m, x: m.silu_and_mul(x)) if kind == "gate_up" else (lambda m, x: m(x))
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(2))
    buffers.write(np.array([(i % 4) - 1 for i in range(37)]), 40)  # slots 0-2 and base-only, 3 padding
    with_adapters = forward(stacked, x)
    torch.testing.assert_close(with_adapters, forward(plain, x), atol=1e-5, rtol=1e-5)
    buffers.write(np.empty(0, dtype=np.int64), 40)  # no adapter in the step: the base rows alone
    torch.testing.assert_close(forward(stacked, x), forward(plain, x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(with_adapters, forward(plain, x), atol=1e-3)  # the adapters did something
    buffers.write(np.empty(0, dtype=np.int64), 40, for_graph=True)  # a capture: kernels run, no adapter
    torch.testing.assert_close(forward(stacked, x), forward(plain, x), atol=1e-5, rtol=1e-5)
