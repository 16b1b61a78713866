"""Tensor-parallel rank, size and collectives; the only place that calls torch.distributed.

This is the single-rank version the linear-layer seam needs: until a tensor-parallel group is
initialised, the rank is 0, the size is 1 and the collectives return their input unchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# The process group of this rank's tensor-parallel peers; None while running on one device.
_TP_GROUP: dist.ProcessGroup | None = None


def get_tp_group() -> dist.ProcessGroup | None:
    return _TP_GROUP


def get_tp_rank() -> int:
    return 0 if _TP_GROUP is None else dist.get_rank(_TP_GROUP)


def get_tp_size() -> int:
    return 1 if _TP_GROUP is None else dist.get_world_size(_TP_GROUP)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the tensor-parallel ranks (in place when there is more than one)."""
    if get_tp_size() == 1:
        return x
    dist.all_reduce(x, group=_TP_GROUP)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in rank order."""
    size = get_tp_size()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=dim)
