"""KVWasteMeter: how much allocated KV memory holds no token, paged vs contiguous preallocation.

Sampled once per step, after scheduling, over the running requests:
- paged (what folio does): the slots of every block in use, against the slots holding a token.
  Tables are sized to their tokens, so the only empty slots are in each table's last block; a
  partial block shared by forks is counted once (at its fullest holder).
- contiguous preallocation (what engines before PagedAttention did, the seeds' 60-80% claim):
  each running request reserves a contiguous region for its longest possible sequence, either
  max_model_len or, more kindly, prompt + max_tokens; no sharing, so each request's tokens are
  its own. Same requests, same steps: only the allocation policy differs.

Each fraction is summed over steps (slot-steps), so long-lived allocations weigh more, as they
do on the memory. The scheduler offers every step and the meter takes one in `every` (the first
included): a ratio over a regular sample of steps, at 1/every of the host cost (a full pass over
the running requests, a few tenths of a millisecond per step at batch 256).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from folio.core.request import Request


@dataclass
class KVWasteMeter:
    block_size: int
    max_model_len: int
    paged_slots: int = 0  # slot-steps in blocks in use
    paged_empty_slots: int = 0  # ... holding no token
    tokens: int = 0  # token-steps of running requests, each request counted on its own
    reserved_max_model_len: int = 0  # slot-steps reserved by preallocating max_model_len
    reserved_max_tokens: int = 0  # ... by preallocating prompt + max_tokens
    every: int = 8  # take one step in this many
    offered: int = 0  # steps offered so far

    def sample(
        self, running: Iterable[Request], tables: Mapping[str, list[int]], num_used_blocks: int
    ) -> None:
        self.offered += 1
        if (self.offered - 1) % self.every:
            return
        fills: dict[int, int] = {}  # last block of a table -> tokens in it
        for request in running:
            table = tables.get(request.request_id)
            if not table:
                continue
            n = request.num_computed_tokens  # this step's tokens included
            self.tokens += n
            self.reserved_max_model_len += self.max_model_len
            limit = request.max_tokens if request.max_tokens is not None else self.max_model_len
            self.reserved_max_tokens += min(self.max_model_len, request.num_prompt_tokens + limit)
            fill = n - (len(table) - 1) * self.block_size
            fills[table[-1]] = max(fills.get(table[-1], 0), fill)
        self.paged_slots += num_used_blocks * self.block_size
        self.paged_empty_slots += sum(self.block_size - f for f in fills.values())

    @property
    def waste_fraction(self) -> float:
        """Fraction of the allocated paged KV slots holding no token (0 before any step)."""
        return self.paged_empty_slots / self.paged_slots if self.paged_slots else 0.0

    @property
    def prealloc_max_model_len_waste_fraction(self) -> float:
        r = self.reserved_max_model_len
        return 1.0 - self.tokens / r if r else 0.0

    @property
    def prealloc_max_tokens_waste_fraction(self) -> float:
        r = self.reserved_max_tokens
        return 1.0 - self.tokens / r if r else 0.0
