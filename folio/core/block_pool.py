"""BlockPool: the physical KV blocks, their reference counts and the free list.

A block is identified by its index 0..num_blocks-1 in the KV cache tensor. It is either in use
(ref count >= 1: it sits in that many block tables) or free (ref count 0: on the free list).

The free list is ordered: blocks are allocated from its head and freed to its tail, so the head
is always the block freed longest ago. Prefix caching keeps a freed block's hash and contents
until the block is allocated again; allocating from the head then evicts the least recently
freed cached block first (`on_evict` is told), and a cache hit on a free block takes it out of
the middle of the list (`incref` on a block with ref count 0). An OrderedDict gives all three
moves in O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, KeysView


class NoFreeBlocksError(RuntimeError):
    """allocate() was asked for more blocks than are free. Callers check can_allocate() first."""


class BlockPool:
    def __init__(self, num_blocks: int, on_evict: Callable[[int], None] | None = None) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}.")
        self.num_blocks = num_blocks
        # Called with each block taken from the free list by allocate(): its old contents die.
        self._on_evict = on_evict
        self._ref_counts = [0] * num_blocks
        # Invariant: block_id is a key here exactly when its ref count is 0. Values are unused.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    # ---- queries ----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of the blocks in use, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def is_free(self, block_id: int) -> bool:
        return block_id in self._free

    def ref_counts(self) -> list[int]:
        """Every block's ref count, by block id: the live list, for views that must not modify it."""
        return self._ref_counts

    def free_blocks_view(self) -> KeysView[int]:
        """The free blocks as a live set-like view (O(1); for views that intersect it)."""
        return self._free.keys()

    def free_block_ids(self) -> list[int]:
        """The free list, head (next to be allocated) first."""
        return list(self._free)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    # ---- moves ------------------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int]:
        """Take num_blocks blocks from the head of the free list, each with ref count 1.

        All or nothing: raises NoFreeBlocksError (and changes nothing) if too few are free.
        """
        if num_blocks < 0:
            raise ValueError(f"Cannot allocate a negative number of blocks ({num_blocks}).")
        if num_blocks > len(self._free):
            raise NoFreeBlocksError(
                f"Asked for {num_blocks} KV blocks, only {len(self._free)} are free."
            )
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            self._ref_counts[block_id] = 1
            if self._on_evict is not None:
                self._on_evict(block_id)
            block_ids.append(block_id)
        return block_ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block (another table now shares it).

        A free block taken this way leaves the free list: that is how a prefix-cache hit
        revives a freed block that still holds the right K/V.
        """
        for block_id in block_ids:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 goes to the free tail.

        Blocks reaching 0 are appended in the order given, so the caller decides which of them
        is evicted first (the KV manager passes a table tail-first: its last blocks are the
        least likely to be shared as a prefix later).
        """
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count == 0:
                raise ValueError(f"KV block {block_id} is already free (double free).")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free[block_id] = None
