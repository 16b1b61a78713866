"""KVCacheManager: each request's block table, and every move of blocks between requests.

A request's block table lists the physical blocks holding its tokens in order: token at position
p lives in slot p % block_size of block table[p // block_size]. Invariants:
- a table is exactly long enough for the tokens the scheduler has allowed into the cache
  (num_computed_tokens plus the tokens of the step being built), rounded up to whole blocks;
  blocks are never handed out ahead of need, except a speculating request's lookahead slots
  (allocate_slots), which the update releases with its rejected drafts' slots;
- a block's ref count equals the number of tables it is in; tables share only leading blocks
  (a prefix-cache hit, or a fork of n > 1 samples or beams), and a request never writes into a
  block another table holds: the block its next token lands in is copied first (copy-on-write);
- a full block is written once, so its prefix-cache entry (core/prefix_cache.py) stays true
  until the block is reallocated.

Moves of K/V the scheduler decides during a step are collected here and handed to the runner in
the SchedulerOutput, which applies them before the forward pass in this order: swap-outs, then
copies, then swap-ins. The order makes every choice made during the step safe:
- a swap-out reads the blocks of a victim as they were at the start of the step (a block the
  victim copied-on-write this step is read from its source, `_content_of`), before any copy or
  swap-in can overwrite a block the victim just gave up;
- a copy's source was computed before the step and its destination is fresh;
- swap-ins write only fresh blocks; nothing reads them before the forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from folio.core.block_hash import lazy_block_hashes, request_block_hashes
from folio.core.block_pool import BlockPool
from folio.core.prefix_cache import PrefixCache
from folio.core.request import Request
from folio.core.swap_space import SwapSpace

BlockMoves = tuple[tuple[int, int], ...]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SharedPrefix:
    """Leading K/V a new request takes from others instead of computing it."""

    block_ids: list[int]  # blocks to share, in table order
    num_tokens: int  # tokens they hold for this request (<= len(block_ids) * block_size)
    from_cache: bool  # a prefix-cache hit (whole blocks), or a fork of the request's parent


NO_PREFIX = SharedPrefix([], 0, True)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = False,
        num_cpu_blocks: int = 0,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}.")
        self.block_size = block_size
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        on_evict = self.prefix_cache.evict if self.prefix_cache is not None else None
        self.block_pool = BlockPool(num_blocks, on_evict=on_evict)
        self.swap_space = SwapSpace(num_cpu_blocks)
        self._tables: dict[str, list[int]] = {}
        # Leading blocks of each table already offered to the prefix cache.
        self._num_cached_blocks: dict[str, int] = {}
        # ---- this step's decisions (reset by begin_step) ----
        self._copies: dict[int, int] = {}  # destination -> source
        self._swap_out: list[tuple[int, int]] = []  # (device block, cpu block)
        self._swap_in: list[tuple[int, int]] = []  # (cpu block, device block)
        # Blocks registered in the prefix cache this step, whose K/V this step computes: block ->
        # the request computing it. Another request may hit them in the same step (the forward
        # pass writes every token's K/V before any attention reads), so `providers` are the
        # requests whose in-flight blocks were taken by a hit: they must not be unscheduled.
        self._cached_this_step: dict[int, str] = {}
        self.providers: set[str] = set()
        # Tables that lost blocks at the end of a step (release_slots_past_computed), reported
        # with the next SchedulerOutput: a runner caching block-table rows must rebuild them.
        self._shrunk: set[str] = set()
        # ---- counters since start ----
        self.num_copied_blocks = 0
        self.prefix_cache_queries = 0  # tokens of requests looked up in the prefix cache
        self.prefix_cache_hits = 0  # tokens served from it

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

    def find_cached_prefix(self, request: Request) -> SharedPrefix:
        """The longest run of the request's leading full blocks found in the prefix cache.

        At least the last token is left to compute (its logits give the next token), so a
        request whose every block is cached recomputes its last block. Requests asking for
        prompt log-probs read nothing from the cache: those come out of the prefill.
        """
        if self.prefix_cache is None or request.sampling_params.prompt_logprobs is not None:
            return NO_PREFIX
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = self.prefix_cache.lookup(lazy_block_hashes(request, self.block_size, max_blocks))
        return SharedPrefix(blocks, len(blocks) * self.block_size, True)

    def fork_prefix(self, parent: Request, num_tokens: int) -> SharedPrefix:
        """The parent's blocks holding its first num_tokens tokens, computed before this step."""
        table = self._tables[parent.request_id]
        return SharedPrefix(table[: cdiv(num_tokens, self.block_size)], num_tokens, False)

    def can_swap_out(self, request: Request) -> bool:
        num = cdiv(request.num_computed_tokens, self.block_size)
        return num > 0 and self.swap_space.can_hold(num)

    # ---- the step's block moves -------------------------------------------------------------
    def begin_step(self) -> None:
        self.swap_space.end_step()  # the previous step's swaps are applied by now
        self._copies, self._swap_out, self._swap_in = {}, [], []
        self._cached_this_step, self.providers = {}, set()

    def end_step(self) -> None:
        """The runner has applied this step's moves."""
        self.swap_space.end_step()

    def take_block_moves(self) -> tuple[BlockMoves, BlockMoves, BlockMoves]:
        """(copies as (src, dst), swap-outs, swap-ins) decided since begin_step."""
        copies = tuple((src, dst) for dst, src in self._copies.items())
        return copies, tuple(self._swap_out), tuple(self._swap_in)

    def _content_of(self, block_id: int) -> int:
        """The block whose K/V block_id will hold once this step's copies run."""
        return self._copies.get(block_id, block_id)

    # ---- growth -----------------------------------------------------------------------------
    def blocks_needed(self, request: Request, num_new_tokens: int, prefix: SharedPrefix | None = None) -> int:
        """Free blocks allocate_slots would take: new blocks, a copy on write, and cached free
        blocks that a prefix revives (they leave the free list too)."""
        if prefix is not None and prefix.block_ids:
            start, shared = prefix.num_tokens, prefix.block_ids
            copy = start % self.block_size != 0
            kept = shared[:-1] if copy else shared
            revived = sum(1 for b in kept if self.block_pool.is_free(b))
            return revived + copy + cdiv(start + num_new_tokens, self.block_size) - len(shared)
        start = request.num_computed_tokens
        table = self._tables.get(request.request_id, [])
        missing = max(0, cdiv(start + num_new_tokens, self.block_size) - len(table))
        return missing + self._is_shared(table, start)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        prefix: SharedPrefix | None = None,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Make the table hold num_new_tokens more tokens after the computed ones.

        With a prefix (a request holding no blocks yet), the table starts with the prefix's
        blocks and the new tokens follow prefix.num_tokens; the caller then sets
        num_computed_tokens to prefix.num_tokens. All or nothing: returns False, changing
        nothing, when the pool has fewer free blocks than blocks_needed.

        num_lookahead_tokens (speculative decoding, no prefix): slots past the step's tokens
        that a draft model writes its own K/V into while it proposes; released with the
        rejected drafts' slots at the update (release_slots_past_computed).
        """
        if prefix is None:
            # Blocks filled by known tokens only are cached (_cache_full_blocks caps at
            # request.num_tokens), so lookahead slots never register a block.
            num_new_tokens += num_lookahead_tokens
        if prefix is not None and prefix.block_ids:
            if not self.block_pool.can_allocate(self.blocks_needed(request, num_new_tokens, prefix)):
                return False
            self._share_prefix(request, num_new_tokens, prefix)
            return True
        # As blocks_needed, computed once: most calls are decode tokens that need nothing.
        start = request.num_computed_tokens
        table = self._tables.get(request.request_id)
        shared = table is not None and self._is_shared(table, start)
        missing = max(0, cdiv(start + num_new_tokens, self.block_size) - len(table or ()))
        if (missing or shared) and not self.block_pool.can_allocate(missing + shared):
            return False
        if table is None:
            table = self._tables[request.request_id] = []
        if shared:
            self._copy_on_write(table, start // self.block_size)
        if missing:
            table.extend(self.block_pool.allocate(missing))
        self._cache_full_blocks(request, start + num_new_tokens)
        return True

    def release_slots_past_computed(self, request: Request) -> None:
        """Free the table's blocks past num_computed_tokens (rejected drafts, lookahead slots).

        They hold no known token's K/V, so none is in the prefix cache, and a block past the
        computed tokens is never shared (a fork shares only computed blocks)."""
        table = self._tables.get(request.request_id)
        if not table:
            return
        keep = cdiv(request.num_computed_tokens, self.block_size)
        if len(table) > keep:
            self.block_pool.free(reversed(table[keep:]))
            del table[keep:]
            self._shrunk.add(request.request_id)

    def take_shrunk(self) -> frozenset[str]:
        """Ids of the tables that lost blocks since the last call."""
        shrunk, self._shrunk = frozenset(self._shrunk), set()
        return shrunk

    def _share_prefix(self, request: Request, num_new: int, prefix: SharedPrefix) -> None:
        if self._tables.get(request.request_id):
            raise ValueError(f"{request.request_id} already holds blocks; a prefix comes first.")
        start, shared = prefix.num_tokens, prefix.block_ids
        # A fork ends mid-block: that block is the one the request writes next, so it gets a
        # copy rather than a share. Cache hits are whole blocks and are all shared.
        copy = start % self.block_size != 0
        kept = shared[:-1] if copy else shared
        self.block_pool.incref(kept)  # first: revived blocks leave the free list, never evicted
        table = list(kept)
        if copy:
            [dst] = self.block_pool.allocate(1)
            self._copies[dst] = self._content_of(shared[-1])
            self.num_copied_blocks += 1
            table.append(dst)
        table.extend(self.block_pool.allocate(cdiv(start + num_new, self.block_size) - len(shared)))
        self._tables[request.request_id] = table
        self.providers.update(self._cached_this_step[b] for b in kept if b in self._cached_this_step)
        self._num_cached_blocks[request.request_id] = start // self.block_size
        self._cache_full_blocks(request, start + num_new)

    def _is_shared(self, table: list[int], position: int) -> bool:
        index = position // self.block_size
        return index < len(table) and self.block_pool.ref_count(table[index]) > 1

    def _copy_on_write(self, table: list[int], index: int) -> None:
        """Give the table its own copy of block `index` (shared with another table)."""
        src = table[index]
        [dst] = self.block_pool.allocate(1)
        self._copies[dst] = self._content_of(src)
        table[index] = dst
        self.block_pool.free([src])  # the other holders keep it
        self.num_copied_blocks += 1

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the blocks that num_tokens fill (computed by the end of this step).

        Only blocks of known tokens: a block whose last slot holds a placeholder (a token the
        step in flight is sampling) is registered at the request's next allocation, once the
        token is known; if that token ends the request, never. So a cached block is never one
        that a wasted step writes into.
        """
        if self.prefix_cache is None:
            return
        request_id = request.request_id
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        done = self._num_cached_blocks.get(request_id, 0)
        if num_full <= done:
            return
        hashes = request_block_hashes(request, self.block_size, num_full)
        table = self._tables[request_id]
        for i in range(done, num_full):
            if self.prefix_cache.insert(table[i], hashes[i]):
                self._cached_this_step[table[i]] = request_id
        self._num_cached_blocks[request_id] = num_full

    def count_lookup(self, request: Request, prefix: SharedPrefix) -> None:
        """Count one admission's prefix-cache lookup (for the hit rate)."""
        if self.prefix_cache is not None and prefix.from_cache:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += prefix.num_tokens

    # ---- sharing ----------------------------------------------------------------------------
    def fork(self, parent: Request, child: Request) -> None:
        """Give child the parent's blocks for its first child.num_computed_tokens tokens.

        Called between steps (beam search). The child's next write lands in a block the two
        share, so it copies that block on write.
        """
        table = self._tables.get(parent.request_id, [])
        num = cdiv(child.num_computed_tokens, self.block_size)
        if num > len(table):
            raise ValueError(f"{parent.request_id} holds {len(table)} blocks, the fork needs {num}.")
        if num == 0:
            return
        shared = table[:num]
        self.block_pool.incref(shared)
        self._tables[child.request_id] = list(shared)
        parent_cached = self._num_cached_blocks.get(parent.request_id, 0)
        self._num_cached_blocks[child.request_id] = min(parent_cached, child.num_computed_tokens // self.block_size)

    # ---- release ----------------------------------------------------------------------------
    def free(self, request: Request) -> None:
        """Return all of the request's blocks, device and CPU; holding none is a no-op."""
        self.swap_space.discard(request.request_id)
        self._release_device_blocks(request)

    def _release_device_blocks(self, request: Request) -> None:
        table = self._tables.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        if not table:
            return
        self._forget_uncomputed(request, table)
        # Tail first: when prefix caching keeps freed blocks, a sequence's last blocks are
        # the least likely to be shared, so they should be the first evicted.
        self.block_pool.free(reversed(table))
        for block_id in table:
            if block_id in self._copies and self.block_pool.is_free(block_id):
                del self._copies[block_id]  # nobody will read the copy

    def _forget_uncomputed(self, request: Request, table: list[int]) -> None:
        """Unregister blocks cached this step whose K/V will not be computed after all (the
        request was unscheduled; num_computed_tokens is back to what the cache holds)."""
        if self.prefix_cache is None:
            return
        first_uncomputed = request.num_computed_tokens // self.block_size
        for block_id in table[first_uncomputed:]:
            if self._cached_this_step.get(block_id) == request.request_id:
                self.prefix_cache.remove(block_id)
                del self._cached_this_step[block_id]

    # ---- swapping ---------------------------------------------------------------------------
    def swap_out(self, request: Request) -> bool:
        """Move the request's computed K/V to CPU blocks and free its device blocks.

        False (nothing changed) when it has nothing computed or the CPU pool is too full.
        """
        if not self.can_swap_out(request):
            return False
        num = cdiv(request.num_computed_tokens, self.block_size)
        table = self._tables[request.request_id][:num]
        cpu_blocks = self.swap_space.store(request.request_id, num)
        self._swap_out.extend((self._content_of(g), c) for g, c in zip(table, cpu_blocks))
        self._release_device_blocks(request)
        return True

    def blocks_needed_to_swap_in(self, request: Request, num_new_tokens: int) -> int:
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        cached = self._cached_blocks_of(request)
        return sum(1 for b in cached if self.block_pool.is_free(b)) + total - len(cached)

    def swap_in(self, request: Request, num_new_tokens: int) -> bool:
        """Bring a swapped-out request back with room for num_new_tokens more tokens; all or
        nothing. Its leading full blocks that the prefix cache still holds are shared again
        instead of copied back (its family or other requests may hold them)."""
        if not self.block_pool.can_allocate(self.blocks_needed_to_swap_in(request, num_new_tokens)):
            return False
        held = self.swap_space.num_held_blocks(request.request_id)
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)  # >= held
        cached = self._cached_blocks_of(request)
        self.block_pool.incref(cached)
        self.providers.update(self._cached_this_step[b] for b in cached if b in self._cached_this_step)
        cpu_blocks = self.swap_space.take(request.request_id)[len(cached) :]
        device_blocks = self.block_pool.allocate(len(cpu_blocks))
        self._swap_in.extend(zip(cpu_blocks, device_blocks))
        self.swap_space.num_swapped_in_blocks += len(cpu_blocks)
        table = cached + device_blocks + self.block_pool.allocate(total - held)
        self._tables[request.request_id] = table
        self._num_cached_blocks[request.request_id] = len(cached)
        self._cache_full_blocks(request, request.num_computed_tokens + num_new_tokens)
        return True

    def _cached_blocks_of(self, request: Request) -> list[int]:
        """The longest run of the request's computed full blocks found in the prefix cache."""
        if self.prefix_cache is None:
            return []
        num_full = request.num_computed_tokens // self.block_size
        return self.prefix_cache.lookup(request_block_hashes(request, self.block_size, num_full))
