"""FP8 W8A8 linear layers: e4m3 weights with per-channel scales, activations quantized per token
(dynamic) or with a static per-tensor scale, multiplied on the FP8 tensor cores.

Two sources: a compressed-tensors checkpoint (llm-compressor's FP8_DYNAMIC: per-channel weight
scales, dynamic per-token activations; FP8: per-tensor weight and static activation scales) or
`quantization="fp8"` on an unquantized checkpoint, which quantizes each weight per channel after
loading. Per-tensor weight scales of a merged layer (one per shard) become per-channel scales,
which is exact, so every layer runs the same per-token x per-channel GEMM.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from folio.kernels.fp8_gemm import FP8_DTYPE, Fp8Activation, fp8_linear, quantize_weight_per_channel
from folio.layers.quantization.base import LinearMethod, QuantizationConfig, new_param

WeightStrategy = Literal["channel", "tensor"]


class Fp8LinearMethod(LinearMethod):
    """W8A8 FP8. serialized: the checkpoint holds e4m3 weights and their scales; otherwise the
    layer loads the model-dtype weight and quantizes it in process_weights_after_loading."""

    name = "fp8-w8a8"

    def __init__(
        self,
        serialized: bool,
        weight_strategy: WeightStrategy = "channel",
        static_input_scale: bool = False,
    ) -> None:
        if not serialized and static_input_scale:
            raise ValueError("A static FP8 input scale needs a checkpoint that stores it.")
        self.serialized = serialized
        self.weight_strategy = weight_strategy
        self.static_input_scale = static_input_scale

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        out, shards = sum(output_partition_sizes), len(output_partition_sizes)
        weight_dtype = FP8_DTYPE if self.serialized else params_dtype
        new_param(layer, "weight", (out, input_size_per_partition), weight_dtype, output_dim=0, input_dim=1)
        if not self.serialized:
            return
        if self.weight_strategy == "channel":
            new_param(layer, "weight_scale", (out, 1), torch.float32, output_dim=0)
        else:
            new_param(layer, "weight_scale", (shards,), torch.float32, shard_scale=True)
        if self.static_input_scale:
            new_param(layer, "input_scale", (shards,), torch.float32, shard_scale=True)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if not self.serialized:
            w_q, w_scale = quantize_weight_per_channel(layer.weight.data)  # [N, K], [N]
        elif self.weight_strategy == "channel":
            w_q, w_scale = layer.weight.data, layer.weight_scale.data.reshape(-1)
        else:
            sizes = torch.tensor(layer.output_partition_sizes, device=layer.weight.device)
            w_q, w_scale = layer.weight.data, layer.weight_scale.data.repeat_interleave(sizes)
        layer.weight = nn.Parameter(w_q, requires_grad=False)
        layer.weight_scale = nn.Parameter(w_scale.float().contiguous(), requires_grad=False)
        if self.static_input_scale:
            # Every shard sees the same input; the largest scale covers all of them.
            scale = layer.input_scale.data.amax()
            layer.input_scale = nn.Parameter(scale.float(), requires_grad=False)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        input_scale = layer.input_scale if self.static_input_scale else None
        if isinstance(x, Fp8Activation):  # quantized by the kernel that made it (the fused RMSNorm)
            shape = x.q.shape
            x2 = Fp8Activation(x.q.reshape(-1, shape[-1]), x.scale.reshape(-1, 1), x.dtype)
        else:
            shape, x2 = x.shape, x.reshape(-1, x.shape[-1])  # [tokens, K]
        out = fp8_linear(x2, layer.weight, layer.weight_scale, input_scale, bias)  # [tokens, N]
        return out.reshape(*shape[:-1], out.shape[-1])

    def takes_fp8_activation(self, layer: nn.Module) -> bool:
        """Whether apply takes per-token Fp8Activation input (dynamic activation scales only)."""
        return not self.static_input_scale


class Fp8Config(QuantizationConfig):
    """quantization="fp8": every linear layer of an unquantized checkpoint, quantized on load."""

    name = "fp8"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8Config:
        return cls()

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return Fp8LinearMethod(serialized=False)
