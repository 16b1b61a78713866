"""Tensor parallelism over torch.distributed: rank, size and the collectives layers call.

This package is the only place that calls torch.distributed. Until a tensor-parallel group is
initialised (parallel/group.py) the rank is 0, the size is 1 and every collective returns its
input unchanged, so single-device code pays nothing.
"""

from folio.parallel.collectives import all_gather, all_reduce, all_reduce_min, broadcast
from folio.parallel.group import get_tp_group, get_tp_rank, get_tp_size

__all__ = [
    "all_gather",
    "all_reduce",
    "all_reduce_min",
    "broadcast",
    "get_tp_group",
    "get_tp_rank",
    "get_tp_size",
]
