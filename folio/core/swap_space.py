"""SwapSpace: the CPU block pool that holds preempted requests' K/V, and whose blocks are whose.

A request swapped out keeps its num_computed_tokens; its K/V move to CPU blocks (one per GPU
block of its table, in table order) and come back to fresh GPU blocks when it is admitted again.
The copies themselves are the runner's (SchedulerOutput.blocks_to_swap_out / _in).

CPU blocks given up during a step (a swap-in read them, or their request was aborted) return to
the pool only when the step is over (`end_step`): a swap-out in the same step could otherwise be
handed a CPU block that a swap-in of that step has not read yet, and the runner applies all
swap-outs before all swap-ins.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from folio.core.block_pool import BlockPool


class SwapSpace:
    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be a non-negative integer, got {num_blocks!r}.")
        self.pool = BlockPool(num_blocks) if num_blocks else None
        self._tables: dict[str, list[int]] = {}
        self._releasing: list[int] = []
        self.num_swapped_out_blocks = 0  # since start
        self.num_swapped_in_blocks = 0

    # ---- queries ----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks if self.pool else 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks a swap-out may take now (those released this step are not yet counted)."""
        return self.pool.num_free_blocks if self.pool else 0

    def can_hold(self, num_blocks: int) -> bool:
        return self.pool is not None and self.pool.can_allocate(num_blocks)

    def holds(self, request_id: str) -> bool:
        return request_id in self._tables

    def num_held_blocks(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    @property
    def tables(self) -> Mapping[str, list[int]]:
        return MappingProxyType(self._tables)

    # ---- moves ------------------------------------------------------------------------------
    def store(self, request_id: str, num_blocks: int) -> list[int]:
        """CPU blocks for a request being swapped out; the caller checked can_hold."""
        if request_id in self._tables:
            raise ValueError(f"Request {request_id!r} is already swapped out.")
        assert self.pool is not None
        blocks = self.pool.allocate(num_blocks)
        self._tables[request_id] = blocks
        self.num_swapped_out_blocks += num_blocks
        return blocks

    def take(self, request_id: str) -> list[int]:
        """The request's CPU blocks, for a swap-in; they are released when the step ends.
        (The caller counts num_swapped_in_blocks: it may copy back only some of them.)"""
        blocks = self._tables.pop(request_id)
        self._releasing.extend(blocks)
        return blocks

    def discard(self, request_id: str) -> None:
        """Drop a swapped request's K/V (it finished or will recompute); released at step end."""
        self._releasing.extend(self._tables.pop(request_id, ()))

    def end_step(self) -> None:
        """The runner has applied this step's swaps: blocks given up during it are free again."""
        if self._releasing:
            assert self.pool is not None
            self.pool.free(self._releasing)
            self._releasing = []
