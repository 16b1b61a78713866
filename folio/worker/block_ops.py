"""Block moves on the paged KV cache: copy-on-write copies, and swaps to and from a CPU pool.

The KV cache is one tensor [layers, 2, blocks, block_size, kv_heads, head_dim], so one indexed
op moves a block of every layer. The CPU swap pool is laid out block-major,
[cpu_blocks, layers, 2, block_size, kv_heads, head_dim], so each CPU block is one contiguous
range: a swap is one gather (or scatter) on the device plus one host copy per run of
consecutive CPU blocks.

On a GPU the pool is pinned and every host copy is non_blocking: swap-outs, copies and swap-ins
are queued on the current stream in that order, before the forward pass, and the host never
touches the pool, so stream order is all the synchronisation they need. The pool is allocated
on the first swap-out, so an engine that never swaps never pins the memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from folio.config import EngineConfig
from folio.core.scheduler_output import SchedulerOutput
from folio.logger import init_logger
from folio.worker.kv_cache import KVCacheSpec

logger = init_logger(__name__)

_GIB = 1 << 30
Pairs = Sequence[tuple[int, int]]


class SwapPool:
    """The CPU blocks preempted requests are swapped to."""

    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = device  # the KV cache's device
        self._tensor: torch.Tensor | None = None

    @classmethod
    def for_config(cls, spec: KVCacheSpec, config: EngineConfig, device: torch.device) -> SwapPool:
        """swap_space GiB worth of blocks; none when preemption is forced to recompute."""
        num = 0
        if config.scheduler.preemption_mode != "recompute":
            num = int(config.cache.swap_space_gib * _GIB) // spec.bytes_per_block
        return cls(spec, num, device)

    @property
    def tensor(self) -> torch.Tensor:  # [cpu_blocks, layers, 2, block_size, kv_heads, dim]
        if self._tensor is None:
            s = self.spec
            shape = (self.num_blocks, s.num_layers, 2, s.block_size, s.num_kv_heads, s.head_dim)
            pin = self.device.type == "cuda"
            self._tensor = torch.empty(shape, dtype=s.dtype, device="cpu", pin_memory=pin)
            logger.info(
                "Swap pool: %d CPU blocks (%.2f GiB%s)",
                self.num_blocks,
                self.num_blocks * s.bytes_per_block / _GIB,
                ", pinned" if pin else "",
            )
        return self._tensor


def apply_block_moves(kv_cache: torch.Tensor, swap_pool: SwapPool | None, out: SchedulerOutput) -> None:
    """The step's moves in the order the scheduler relies on: swap-outs, copies, swap-ins."""
    if out.blocks_to_swap_out:
        swap_out(kv_cache, _pool(swap_pool), out.blocks_to_swap_out)
    if out.blocks_to_copy:
        copy_blocks(kv_cache, out.blocks_to_copy)
    if out.blocks_to_swap_in:
        swap_in(kv_cache, _pool(swap_pool), out.blocks_to_swap_in)


def _pool(swap_pool: SwapPool | None) -> torch.Tensor:
    if swap_pool is None or swap_pool.num_blocks == 0:
        raise RuntimeError("The scheduler asked for a swap but the runner has no swap pool.")
    return swap_pool.tensor


def copy_blocks(kv_cache: torch.Tensor, pairs: Pairs) -> None:
    """kv_cache[:, :, dst] = kv_cache[:, :, src] for each (src, dst); every source is read
    before any destination is written."""
    src = _index([s for s, _ in pairs], kv_cache.device)
    dst = _index([d for _, d in pairs], kv_cache.device)
    kv_cache[:, :, dst] = kv_cache[:, :, src]  # the right side is a gathered copy


def swap_out(kv_cache: torch.Tensor, pool: torch.Tensor, pairs: Pairs) -> None:
    """Copy device blocks to CPU blocks: (device block, cpu block) pairs."""
    device_ids = _index([g for g, _ in pairs], kv_cache.device)
    staged = kv_cache[:, :, device_ids].movedim(2, 0)  # [n, layers, 2, block_size, heads, dim]
    if kv_cache.device.type == "cpu":
        pool[torch.tensor([c for _, c in pairs])] = staged
        return
    staged = staged.contiguous()
    for first, start, count in _runs([c for _, c in pairs]):
        pool[start : start + count].copy_(staged[first : first + count], non_blocking=True)


def swap_in(kv_cache: torch.Tensor, pool: torch.Tensor, pairs: Pairs) -> None:
    """Copy CPU blocks to device blocks: (cpu block, device block) pairs."""
    device_ids = _index([g for _, g in pairs], kv_cache.device)
    if kv_cache.device.type == "cpu":
        kv_cache[:, :, device_ids] = pool[torch.tensor([c for c, _ in pairs])].movedim(0, 2)
        return
    staged = torch.empty((len(pairs), *pool.shape[1:]), dtype=pool.dtype, device=kv_cache.device)
    for first, start, count in _runs([c for c, _ in pairs]):
        staged[first : first + count].copy_(pool[start : start + count], non_blocking=True)
    kv_cache[:, :, device_ids] = staged.movedim(0, 2)  # [layers, 2, n, block_size, heads, dim]


def _runs(cpu_ids: list[int]) -> list[tuple[int, int, int]]:
    """(index in the list, first cpu block, count) for each run of consecutive cpu blocks."""
    runs: list[tuple[int, int, int]] = []
    for i, c in enumerate(cpu_ids):
        if runs and c == runs[-1][1] + runs[-1][2] and i == runs[-1][0] + runs[-1][2]:
            first, start, count = runs[-1]
            runs[-1] = (first, start, count + 1)
        else:
            runs.append((i, c, 1))
    return runs


def _index(ids: list[int], device: torch.device) -> torch.Tensor:
    tensor = torch.tensor(ids, dtype=torch.int64)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor
