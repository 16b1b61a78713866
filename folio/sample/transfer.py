"""Host data to device tensors without making the host wait for the device.

A copy from ordinary (pageable) host memory to a GPU synchronises the stream: the host would
wait for the forward pass still queued before it. Through pinned memory the copy is queued
like any kernel; the caching host allocator keeps the pinned block alive until it is done.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch


def to_device(
    values: Sequence[int] | Sequence[float] | Sequence[bool],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    return move(torch.tensor(values, dtype=dtype), device)


def flat_token_ids(token_lists: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """[total] int64: the lists one after another. Penalties send whole prompts and outputs
    every step, so this goes through numpy, several times faster than torch.tensor(list)."""
    total = sum(len(ids) for ids in token_lists)
    flat = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=total)
    return move(torch.from_numpy(flat), device)


def move(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
