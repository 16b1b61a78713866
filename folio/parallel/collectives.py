"""The collectives layers and the engine use; no-ops while the tensor-parallel size is 1.

Each one runs over the tensor-parallel group (parallel/group.py) in rank order, so every rank
must call the same collectives in the same order with the same shapes: the step plan
(parallel/step_plan.py) is what keeps the ranks in step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from folio.parallel.group import get_tp_group, get_tp_size


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the ranks, in place (CUDA-graph capturable on NCCL)."""
    if get_tp_size() == 1:
        return x
    dist.all_reduce(x, group=get_tp_group())
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Every rank's `x` concatenated along `dim`, in rank order (same shape on every rank)."""
    size = get_tp_size()
    if size == 1:
        return x
    x = x.contiguous()
    x = x.reshape(1, *x.shape) if x.dim() == 0 else x
    out = torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)  # ranks stacked on dim 0
    _gather_single(out, x, group=get_tp_group())
    return torch.cat(out.chunk(size, dim=0), dim=dim)


# torch >= 2.13 names it all_gather_single (all_gather_into_tensor is deprecated there).
_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def broadcast(x: torch.Tensor, src: int = 0, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Rank `src`'s `x` into every rank's `x` (same shape and dtype everywhere), in place.
    group: the tensor-parallel group unless given (step plans use their own, untimed)."""
    if get_tp_size() > 1:
        dist.broadcast(x, src=src, group=group or get_tp_group())
    return x


def all_reduce_min(value: int, device: torch.device) -> int:
    """The smallest `value` over the ranks (e.g. the KV blocks every rank can hold)."""
    if get_tp_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=get_tp_group())
    return int(t.item())
