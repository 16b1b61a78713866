"""KVCacheManager: each request's block table, grown from the BlockPool as its tokens arrive.

A request's block table lists the physical blocks holding its tokens in order: token at position
p lives in slot p % block_size of block table[p // block_size]. Invariant: a table is exactly
long enough for the tokens the scheduler has allowed into the cache (num_computed_tokens plus
the tokens of the step being built), rounded up to whole blocks; blocks are never handed out
ahead of need, so a short request never pins memory it will not use.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from folio.core.block_pool import BlockPool
from folio.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}

    # ---- queries ----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    @property
    def block_tables(self) -> Mapping[str, list[int]]:
        """Read-only view of every table, by request id (for invariant checks and views)."""
        return MappingProxyType(self._tables)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's live block table (the same list as it grows); [] if it holds none.

        The runner reads it through ScheduledRequest.block_ids and must not modify it.
        """
        return self._tables.get(request_id, [])

    def num_missing_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks to add so the table covers num_computed_tokens + num_new_tokens tokens."""
        needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, needed - len(self._tables.get(request.request_id, ())))

    # ---- moves ------------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the table to hold num_new_tokens more tokens after the computed ones.

        Returns False, changing nothing, when the pool has too few free blocks.
        """
        missing = self.num_missing_blocks(request, num_new_tokens)
        if not self.block_pool.can_allocate(missing):
            return False
        table = self._tables.setdefault(request.request_id, [])
        table.extend(self.block_pool.allocate(missing))
        return True

    def free(self, request: Request) -> None:
        """Return all of the request's blocks; a request holding none is a no-op."""
        table = self._tables.pop(request.request_id, None)
        if table:
            # Tail first: when prefix caching keeps freed blocks, a prompt's last blocks are
            # the least likely to be shared, so they should be the first evicted.
            self.block_pool.free(reversed(table))
