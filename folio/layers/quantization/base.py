"""LinearMethod and QuantizationConfig: how a linear layer stores its weight and multiplies.

A linear layer owns its shape role (how the weight splits over tensor-parallel ranks); its
method owns the storage. The method registers parameters on the layer, each tagged with the
attributes the layer's weight_loader reads:
  output_dim / input_dim: which axis of the tensor runs along output / input features (None:
    the tensor has no such axis, e.g. a per-tensor scale);
  packed_dim + pack_factor: that axis stores pack_factor values per element (INT4 in int32);
    offsets and sizes along it are divided by pack_factor;
  group_size: the input axis holds one entry per group of group_size input features
    (per-group INT4 scales and zeros); offsets along it are divided by group_size;
  shard_scale: dim 0 indexes merged shards (a per-tensor scale of a fused QKV or gate/up, or
    a per-shard row such as GPTQ's g_idx);
  optional: the checkpoint may leave it out (the loader does not report it missing).
After every tensor arrived, process_weights_after_loading repacks for the method's kernel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from folio.kernels.gemv import linear

# Fused layers folio builds -> the checkpoint modules they merge (for per-layer configs, which
# name checkpoint modules, e.g. an `ignore` list naming q_proj).
FUSED_SHARDS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def checkpoint_prefixes(prefix: str) -> list[str]:
    """The checkpoint module names a layer prefix stands for (several for a fused layer)."""
    head, _, leaf = prefix.rpartition(".")
    shards = FUSED_SHARDS.get(leaf)
    if shards is None:
        return [prefix]
    return [f"{head}.{s}" if head else s for s in shards]


def set_weight_attrs(param: nn.Parameter, **attrs: Any) -> nn.Parameter:
    for key, value in attrs.items():
        setattr(param, key, value)
    return param


def new_param(
    layer: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype, **attrs: Any
) -> nn.Parameter:
    """Register an uninitialised, frozen parameter `name` on `layer` with loader attributes."""
    attrs.setdefault("output_dim", None)
    attrs.setdefault("input_dim", None)
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    set_weight_attrs(param, **attrs)
    layer.register_parameter(name, param)
    return param


class LinearMethod(ABC):
    """Creates a linear layer's parameters, finishes them after loading, and applies the matmul."""

    #: short name for the per-model summary in the log ("unquantized", "fp8-w8a8", ...)
    name: str = "linear"

    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None: ...

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027
        """Repack loaded tensors for the kernel; the default keeps them as loaded."""

    @abstractmethod
    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,  # [tokens, in_per_partition]
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # [tokens, out_per_partition]
        ...

    def takes_fp8_activation(self, layer: nn.Module) -> bool:
        """Whether apply also takes activations already quantized per token to FP8
        (fp8_gemm.Fp8Activation), so the kernel before the layer may emit them."""
        return False


class UnquantizedLinearMethod(LinearMethod):
    """The weight in the model dtype, [out, in] as checkpoints store it; y = x W^T + b."""

    name = "unquantized"

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        shape = (sum(output_partition_sizes), input_size_per_partition)
        new_param(layer, "weight", shape, params_dtype, output_dim=0, input_dim=1)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """cuBLAS, except one 16-bit row on CUDA (batch-1 decode): the Triton GEMV
        (folio/kernels/gemv.py; FOLIO_GEMV=0 keeps cuBLAS there too)."""
        return linear(x, layer.weight, bias)


class QuantizationConfig(ABC):
    """One model's quantization scheme, read once; picks each linear layer's method."""

    #: the name users pass as `quantization=` and the checkpoint's quant_method
    name: str = ""

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethod:
        """The method for the linear layer at `prefix` (folio's module name, e.g. a fused
        "model.layers.0.self_attn.qkv_proj"); UnquantizedLinearMethod for an ignored layer."""

    def kv_cache_scales(self) -> bool:
        """Whether the checkpoint carries k/v cache scales (k_scale / v_scale tensors)."""
        return False
