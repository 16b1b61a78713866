"""DraftModelProposer: a smaller model of any supported architecture, same vocabulary, drafts k
tokens by greedy autoregression.

Its K/V lives in its own paged cache tensors with the target's block count and block size, and
the target's block tables and slot mapping address both: a request's draft K/V sits in the
same block ids as its target K/V. So prefix-cache hits, forks and copy-on-write copies hold
for the draft too (the runner applies each step's block copies and swaps to both caches).

Each step the draft first runs the target's own batch (prompt chunks, decode tokens, the
verified drafts), which writes its K/V exactly where the target's went; the accepted part is
what later steps read. Then, for each request that sampled, it feeds the newest token and its
own k - 1 argmaxes, one decode step at a time, into the lookahead slots past the step that the
scheduler reserved (core/speculation.py). Those slots are rewritten by the next step's batch,
so a rejected draft's K/V is never read.
"""

from __future__ import annotations

import numpy as np
import torch

from folio.attention.metadata import AttentionMetadata
from folio.config import ModelConfig
from folio.models.loader import load_model
from folio.spec_decode.proposer import ProposalBatch, Proposer, speculating
from folio.worker import block_ops
from folio.worker import kv_cache as kvc


class DraftModelProposer(Proposer):
    def __init__(
        self,
        config: ModelConfig,
        num_speculative_tokens: int,
        block_size: int,
        max_model_len: int,
        device: torch.device,
        attn_backend,  # noqa: ANN001 (folio.attention.backends.base.AttentionBackend)
    ) -> None:
        super().__init__(num_speculative_tokens)
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.model = load_model(config, device, attn_backend)
        self.kv_spec = kvc.KVCacheSpec(
            num_layers=len(self.model.attention_layers()),
            block_size=block_size,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            dtype=next(self.model.parameters()).dtype,
        )
        self.kv_cache: torch.Tensor | None = None  # [layers, 2, blocks, block_size, kv_heads, dim]
        self.swap_pool: block_ops.SwapPool | None = None

    # ---- K/V ------------------------------------------------------------------------------
    @property
    def kv_bytes_per_block(self) -> int:
        return self.kv_spec.bytes_per_block

    def initialize_kv_cache(self, num_blocks: int, num_cpu_blocks: int = 0) -> None:
        self.kv_cache = kvc.allocate_kv_cache(self.kv_spec, num_blocks, self.device)
        self.model.bind_kv_caches(list(self.kv_cache.unbind(0)))
        self.swap_pool = block_ops.SwapPool(self.kv_spec, num_cpu_blocks, self.device)

    def move_blocks(self, scheduler_output) -> None:  # noqa: ANN001
        so = scheduler_output
        if so.blocks_to_copy or so.blocks_to_swap_out or so.blocks_to_swap_in:
            assert self.kv_cache is not None
            block_ops.apply_block_moves(self.kv_cache, self.swap_pool, so)

    # ---- drafting -------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, batch: ProposalBatch) -> dict[int, list[int]]:
        inputs = batch.inputs
        self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata)  # draft K/V of the batch
        indices = speculating(batch)
        positions = [batch.position_of_last(i) for i in indices]
        # Slots the request's table covers (its lookahead included), and never past max_model_len.
        limits = [
            max(0, min(self.k, len(batch.scheduled[i].block_ids) * self.block_size - p, self.max_model_len - p))
            for i, p in zip(indices, positions)
        ]
        tokens = torch.tensor([batch.emitted[i][-1] for i in indices], dtype=torch.int64, device=self.device)  # [n]
        steps: list[tuple[list[int], torch.Tensor]] = []  # (live rows, their argmaxes), on the device
        for step in range(self.k):
            live = [j for j, limit in enumerate(limits) if step < limit]
            if not live:
                break
            rows = None if len(live) == len(indices) else torch.tensor(live, device=self.device)
            ids = self._decode_step(
                tokens if rows is None else tokens[rows],
                [positions[j] + step for j in live],
                [batch.scheduled[indices[j]].block_ids for j in live],
            )
            steps.append((live, ids))
            if rows is None:
                tokens = ids
            else:
                tokens = tokens.index_copy(0, rows, ids)
        drafts: dict[int, list[int]] = {i: [] for i in indices}
        for live, ids in steps:  # one copy to the host per step, after all of them are queued
            for j, token in zip(live, ids.tolist()):
                drafts[indices[j]].append(token)
        return drafts

    def _decode_step(self, tokens: torch.Tensor, positions: list[int], tables: list[list[int]]) -> torch.Tensor:
        """One token per request at the given positions; the draft's argmax after each [n]."""
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)  # [n]
        metadata = decode_metadata(positions, tables, self.block_size, self.device)
        hidden = self.model(tokens, pos, metadata)  # [n, hidden]
        return self.model.compute_logits(hidden).argmax(dim=-1)  # [n]


def decode_metadata(
    positions: list[int], tables: list[list[int]], block_size: int, device: torch.device
) -> AttentionMetadata:
    """A decode-only batch: sequence i has one new token at positions[i], blocks tables[i]."""
    n = len(positions)
    pos = np.asarray(positions, dtype=np.int64)  # [n]
    width = max(len(t) for t in tables)
    table = np.zeros((n, width), dtype=np.int32)  # [n, width]
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    slots = table[np.arange(n), pos // block_size].astype(np.int64) * block_size + pos % block_size  # [n]
    seq_lens = (pos + 1).astype(np.int32)  # [n]
    query_start_loc = np.arange(n + 1, dtype=np.int32)  # [n + 1]

    def move(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device)

    return AttentionMetadata(
        num_actual_tokens=n,
        num_seqs=n,
        max_query_len=1,
        max_seq_len=int(seq_lens.max()),
        query_start_loc=move(query_start_loc),
        seq_lens=move(seq_lens),
        block_tables=move(table),
        slot_mapping=move(slots),
        query_start_loc_cpu=query_start_loc.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
        is_decode_only=True,
    )
