"""The linear-layer seam: a method's tagged parameters load through the layer's weight_loader."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from folio.config.model import resolve_quantization
from folio.layers.linear import MergedColumnLinear, QKVLinear, RowParallelLinear
from folio.layers.quantization.base import LinearMethod, QuantizationConfig, new_param


class PackedMethod(LinearMethod):
    """A toy method: int32 packs 8 values along input (like GPTQ), one scale per shard."""

    name = "toy-packed"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       input_size, output_size, params_dtype):
        out = sum(output_partition_sizes)
        new_param(layer, "qweight", (input_size_per_partition // 8, out), torch.int32,
                  input_dim=0, output_dim=1, packed_dim=0, pack_factor=8)
        new_param(layer, "scale", (len(output_partition_sizes),), torch.float32, shard_scale=True)

    def apply(self, layer, x, bias):
        raise NotImplementedError


class ToyConfig(QuantizationConfig):
    name = "toy"

    def get_linear_method(self, prefix: str) -> LinearMethod:
        self.seen = getattr(self, "seen", []) + [prefix]
        return PackedMethod()


def test_packed_shards_land_at_their_output_offsets_and_scales_per_shard():
    config = ToyConfig()
    layer = MergedColumnLinear(16, [3, 5], ("a", "b"), quant_config=config, prefix="m.gate_up_proj")
    assert config.seen == ["m.gate_up_proj"]
    assert layer.qweight.shape == (2, 8) and layer.extra_repr().endswith("method=toy-packed")
    layer.qweight.weight_loader(layer.qweight, torch.full((2, 3), 7, dtype=torch.int32), "a")
    layer.qweight.weight_loader(layer.qweight, torch.full((2, 5), 9, dtype=torch.int32), "b")
    assert layer.qweight[:, :3].eq(7).all() and layer.qweight[:, 3:].eq(9).all()
    layer.scale.weight_loader(layer.scale, torch.tensor(0.5), "b")
    layer.scale.weight_loader(layer.scale, torch.tensor([0.25]), "a")
    assert layer.scale.tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match=r"shard 'b' of m.gate_up_proj.qweight.*\(3, 5\)"):
        layer.qweight.weight_loader(layer.qweight, torch.zeros(3, 5, dtype=torch.int32), "b")
    with pytest.raises(ValueError, match="no shard 'c'"):
        layer.qweight.weight_loader(layer.qweight, torch.zeros(2, 5, dtype=torch.int32), "c")
    with pytest.raises(ValueError, match="per-tensor scale"):
        layer.scale.weight_loader(layer.scale, torch.zeros(2), "a")


def test_unquantized_layers_match_f_linear_at_one_rank():
    torch.manual_seed(0)
    row = RowParallelLinear(6, 4, bias=True, prefix="o_proj")
    row.weight.weight_loader(row.weight, torch.randn(4, 6))
    row.bias.weight_loader(row.bias, torch.randn(4))
    x = torch.randn(3, 6)
    torch.testing.assert_close(row(x), nn.functional.linear(x, row.weight, row.bias))
    qkv = QKVLinear(8, 2, 2, 1)
    assert qkv.output_partition_sizes == [4, 2, 2] and qkv.role == "column"
    assert qkv.input_size_per_partition == 8 and qkv.weight.shard_ids == ("q", "k", "v")


@pytest.mark.parametrize(
    ("requested", "stored", "expected"),
    [
        (None, None, None),
        ("fp8", None, "fp8"),
        (None, "compressed-tensors", "compressed-tensors"),
        ("gptq_marlin", "gptq", "gptq"),
        ("awq", "awq", "awq"),
    ],
)
def test_quantization_resolves_from_the_checkpoint_or_the_request(requested, stored, expected):
    hf = {"quantization_config": {"quant_method": stored}} if stored else {}
    assert resolve_quantization(requested, hf) == expected


@pytest.mark.parametrize(
    ("requested", "stored", "message"),
    [
        ("int3", None, "must be one of"),
        ("fp8", "gptq", "does not match the checkpoint, which is quantized with 'gptq'"),
        ("gptq", None, "needs a checkpoint with a quantization_config"),
        (None, "bitsandbytes", "quant_method 'bitsandbytes'"),
    ],
)
def test_quantization_mismatches_are_refused_by_name(requested, stored, message):
    hf = {"quantization_config": {"quant_method": stored}} if stored else {}
    with pytest.raises(ValueError, match=message):
        resolve_quantization(requested, hf)


def test_fp8_layer_takes_activations_quantized_before_it():
    """An FP8 layer with per-token scales takes fp8_gemm.Fp8Activation (what the fused RMSNorm
    emits on CUDA) and gives what it gives for the 16-bit rows; other methods do not take it."""
    from folio.kernels.fp8_gemm import Fp8Activation, quantize_per_token
    from folio.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

    torch.manual_seed(0)
    layer = QKVLinear(64, 16, 2, 1, bias=True, quant_config=Fp8Config(), prefix="l.qkv_proj")
    layer.weight.data.normal_(std=0.05)
    layer.bias.data.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    q, scale = quantize_per_token(x.reshape(-1, 64))
    quantized = Fp8Activation(q.reshape(2, 3, 64), scale.reshape(2, 3, 1), torch.bfloat16)
    assert layer.takes_fp8_activation
    assert torch.equal(layer(quantized), layer(x)) and layer(x).shape == (2, 3, 64)
    assert not RowParallelLinear(64, 32, bias=False, quant_config=None, prefix="o").takes_fp8_activation
    static = Fp8LinearMethod(serialized=True, weight_strategy="tensor", static_input_scale=True)
    assert not static.takes_fp8_activation(layer)
