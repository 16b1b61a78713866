"""PrefixCache: which physical block holds the K/V of which full-block hash.

A block enters the index when it becomes full of computed tokens and leaves it only when the
BlockPool hands it out again (eviction) or when the K/V it was to hold will not be computed
after all (a request unscheduled in the step that registered it). Freeing a block does not
remove it: a freed block keeps its hash and contents on the free list, so a later request with
the same prefix revives it. The free list is ordered by time of freeing, so allocation evicts
the least recently used cached block first.

Invariant: `_block_of` and `_hash_of` are inverse maps — each cached hash names exactly one
block and that block's recorded hash is it. Blocks whose contents duplicate a cached block (two
requests computed the same prefix before either was cached) simply stay out of the index.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from folio.core.block_hash import BlockHash


class PrefixCache:
    def __init__(self) -> None:
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self.num_evicted_blocks = 0  # cached blocks handed out again, since start

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_of)

    def hash_of(self, block_id: int) -> BlockHash | None:
        return self._hash_of.get(block_id)

    def lookup(self, hashes: Iterable[BlockHash]) -> list[int]:
        """The blocks of the longest cached prefix of `hashes` (stops at the first miss)."""
        blocks = []
        for h in hashes:
            block_id = self._block_of.get(h)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks

    def insert(self, block_id: int, block_hash: BlockHash) -> bool:
        """Record that block_id holds block_hash's K/V; False (no change) if the hash is
        already cached in some block or the block already has a hash."""
        if block_hash in self._block_of or block_id in self._hash_of:
            return False
        self._block_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def remove(self, block_id: int) -> None:
        """Forget the block's hash (if any): its contents are about to change or never came."""
        block_hash = self._hash_of.pop(block_id, None)
        if block_hash is not None:
            del self._block_of[block_hash]

    def evict(self, block_id: int) -> None:
        """The pool is reusing this free block for something else."""
        if block_id in self._hash_of:
            self.remove(block_id)
            self.num_evicted_blocks += 1

    def clear(self) -> None:
        """Forget every hash: after a failed step, any block registered since the last good one
        may never have been written."""
        self._block_of.clear()
        self._hash_of.clear()

    def cached_among(self, block_ids: AbstractSet[int]) -> set[int]:
        """Which of these blocks hold a cached hash (a set intersection in C, for views)."""
        return self._hash_of.keys() & block_ids

    def items(self) -> list[tuple[BlockHash, int]]:
        """(hash, block) pairs, for invariant checks."""
        return list(self._block_of.items())
