"""Test-side paging: a shuffled block allocator, per-layer KV caches and AttentionMetadata builder.

The engine's model runner builds the real metadata from a SchedulerOutput; this is a small
independent version so model tests can drive any schedule of (sequence, new tokens) steps.
Physical blocks are handed out in a random order, so a sequence's blocks are never contiguous.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from folio.attention.metadata import AttentionMetadata
from folio.models.base import CausalLM


class PagedKV:
    def __init__(
        self,
        model: CausalLM,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model
        self.block_size = block_size
        num_layers = len(model.attention_layers())
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
        # NaN, not zeros: a read of a slot nobody wrote poisons the logits instead of hiding.
        self.caches = [torch.full(shape, float("nan"), dtype=dtype) for _ in range(num_layers)]
        model.bind_kv_caches(self.caches)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _slots(self, seq: int, num_new: int) -> list[int]:
        table = self.tables.setdefault(seq, [])
        start = self.lens.get(seq, 0)
        end = start + num_new
        while len(table) * self.block_size < end:
            table.append(self.free.pop())
        self.lens[seq] = end
        size = self.block_size
        return [table[p // size] * size + p % size for p in range(start, end)]

    def step(
        self, chunks: Sequence[tuple[int, Sequence[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, metadata) for one flat batch of (sequence id, new token ids)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        for seq, tokens in chunks:
            context = self.lens.get(seq, 0)
            slots += self._slots(seq, len(tokens))
            ids += list(tokens)
            positions += range(context, context + len(tokens))
            starts.append(len(ids))
            seq_lens.append(context + len(tokens))
        width = max(len(self.tables[seq]) for seq, _ in chunks)
        tables = torch.zeros(len(chunks), width, dtype=torch.int32)
        for i, (seq, _) in enumerate(chunks):
            tables[i, : len(self.tables[seq])] = torch.tensor(self.tables[seq], dtype=torch.int32)
        metadata = AttentionMetadata(
            num_actual_tokens=len(ids),
            num_seqs=len(chunks),
            max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
            max_seq_len=max(seq_lens),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
            is_decode_only=len(ids) == len(chunks),
        )
        input_ids = torch.tensor(ids, dtype=torch.int64)
        return input_ids, torch.tensor(positions, dtype=torch.int64), metadata


def run_schedule(
    kv: PagedKV, schedule: Sequence[Sequence[tuple[int, Sequence[int]]]]
) -> dict[int, torch.Tensor]:
    """Run each step through kv.model; return every sequence's logits [its tokens, vocab]."""
    rows: dict[int, list[torch.Tensor]] = {}
    with torch.inference_mode():
        for chunks in schedule:
            input_ids, positions, metadata = kv.step(chunks)
            logits = kv.model.compute_logits(kv.model(input_ids, positions, metadata))
            for i, (seq, _) in enumerate(chunks):
                start, end = metadata.query_start_loc_cpu[i], metadata.query_start_loc_cpu[i + 1]
                rows.setdefault(seq, []).append(logits[start:end])
    return {seq: torch.cat(parts) for seq, parts in rows.items()}


def blocks_needed(lengths: Sequence[int], block_size: int, spare: int = 3) -> int:
    return sum(-(-n // block_size) for n in lengths) + spare
