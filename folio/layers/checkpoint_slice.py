"""CheckpointSlice: a checkpoint tensor not read yet, so a rank reads only its slice of it.

Under tensor parallelism the safetensors reader yields these instead of tensors. They answer
`shape`, `dim()` and `numel()` from the file's header, `narrow()` only narrows the pending
index, and `as_tensor` reads the indexed part through safetensors' get_slice: a rank never
holds a full copy of a sharded weight. Loaders treat a slice and a tensor alike until they copy.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class CheckpointSlice:
    def __init__(self, source: Any, shape: tuple[int, ...], index: tuple[slice, ...] | None = None) -> None:
        self.source = source  # safetensors' PySafeSlice: indexable by a tuple of slices
        self.shape = torch.Size(shape)
        self.index = index if index is not None else tuple(slice(0, n) for n in shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointSlice:
        if not 0 <= start <= start + length <= self.shape[dim]:
            raise ValueError(f"Cannot narrow dim {dim} of a {tuple(self.shape)} tensor to [{start}, {start + length}).")
        base = self.index[dim].start
        index = list(self.index)
        index[dim] = slice(base + start, base + start + length)
        shape = list(self.shape)
        shape[dim] = length
        return CheckpointSlice(self.source, tuple(shape), tuple(index))

    def read(self) -> torch.Tensor:
        if not self.shape:  # a scalar: safetensors slices need at least one axis
            return self.source[:]
        return self.source[self.index]

    def reshape(self, *shape: Any) -> torch.Tensor:
        return self.read().reshape(*shape)


def as_tensor(loaded: torch.Tensor | CheckpointSlice) -> torch.Tensor:
    """The tensor itself, or the slice read from its file now."""
    return loaded.read() if isinstance(loaded, CheckpointSlice) else loaded
