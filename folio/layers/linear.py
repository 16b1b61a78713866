"""Linear layers, including merged projections: several checkpoint matrices, one matmul.

Weights keep PyTorch's [out_features, in_features] layout, as checkpoints store them. A merged
layer's parameters carry two attributes the weight loader reads:
  weight_loader(param, tensor, shard_id): copy one checkpoint matrix into its rows;
  shard_ids: every shard_id that must arrive before the parameter counts as loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def check_shape(name: str, expected: torch.Size, loaded: torch.Tensor) -> None:
    if tuple(expected) != tuple(loaded.shape):
        raise ValueError(
            f"Checkpoint tensor for {name} has shape {tuple(loaded.shape)}, "
            f"the model expects {tuple(expected)}."
        )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)  # [tokens, out]


class Linear(nn.Module):
    """y = x W^T + b with the whole weight on this device (no tensor parallelism yet)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)  # [tokens, output_size]

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}"


class MergedColumnLinear(Linear):
    """Several projections of the same input stacked along the output dimension.

    Shard i occupies output rows [offsets[i], offsets[i] + output_sizes[i]); the checkpoint
    stores each shard as its own matrix, loaded by shard id.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        shard_ids: Sequence[str | int],
        bias: bool = False,
    ) -> None:
        if len(output_sizes) != len(shard_ids):
            raise ValueError("MergedColumnLinear needs one shard id per output size.")
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)
        self.shard_ids = tuple(shard_ids)
        self.offsets = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]
        for param in (self.weight, self.bias):
            if param is not None:
                param.weight_loader = self.load_shard  # type: ignore[attr-defined]
                param.shard_ids = self.shard_ids  # type: ignore[attr-defined]

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int) -> None:
        index = self.shard_ids.index(shard_id)
        start, size = self.offsets[index], self.output_sizes[index]
        rows = param.data.narrow(0, start, size)  # [size] or [size, input_size]
        check_shape(f"shard {shard_id!r} of a merged projection", rows.shape, loaded)
        rows.copy_(loaded)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[tokens, sum(output_sizes)] -> one [tokens, output_sizes[i]] view per shard."""
        return tuple(out.split(self.output_sizes, dim=-1))


class QKVLinear(MergedColumnLinear):
    """Q, K and V projections in one matmul: [tokens, hidden] -> [tokens, (H + 2 * Hkv) * D]."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False
    ) -> None:
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(hidden_size, [q_size, kv_size, kv_size], ("q", "k", "v"), bias)
