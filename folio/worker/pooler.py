"""Pooler: embeddings from a decoder model's final hidden states, as vLLM's embedding runner makes
them for a *ForCausalLM checkpoint (last-token pooling, L2-normalized, by default; mean pooling
on request).

Each call runs one prefill forward per batch of prompts over a private paged KV cache sized to
that batch, so it never touches the generation engine's blocks. With `shared` models (the
offline LLM, whose engine is idle between calls) the model's own KV cache views are rebound
after the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from folio.attention.metadata import AttentionMetadata
from folio.models.base import CausalLM
from folio.pooling_params import PoolerConfig

class Pooler:
    def __init__(self, model: CausalLM, kv_shape: tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device, max_batch_tokens: int, lora=None) -> None:
        """kv_shape: (block_size, num_kv_heads, head_dim) of the model's attention layers.
        lora: the runner's LoRAManager when adapters are enabled (pooling runs the base model)."""
        self.model = model
        self.block_size, self.num_kv_heads, self.head_dim = kv_shape
        self.dtype = dtype
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.lora = lora

    @torch.inference_mode()
    def embed(self, prompts: Sequence[Sequence[int]], config: PoolerConfig) -> list[list[float]]:
        """One embedding per prompt (token ids), in order."""
        out: list[list[float]] = []
        for batch in self._batches(prompts):
            out.extend(self._embed_batch(batch, config))
        return out

    def _batches(self, prompts: Sequence[Sequence[int]]) -> list[list[Sequence[int]]]:
        batches: list[list[Sequence[int]]] = [[]]
        used = 0
        for prompt in prompts:
            if batches[-1] and used + len(prompt) > self.max_batch_tokens:
                batches.append([])
                used = 0
            batches[-1].append(prompt)
            used += len(prompt)
        return [b for b in batches if b]

    def _embed_batch(self, prompts: list[Sequence[int]], config: PoolerConfig) -> list[list[float]]:
        previous = [layer.kv_cache for layer in self.model.attention_layers()]
        input_ids, positions, metadata, num_blocks = self._prefill_inputs(prompts)
        caches = torch.empty(  # [layers, 2, blocks, block_size, kv_heads, dim]; every read slot is written
            (len(previous), 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim),
            dtype=self.dtype, device=self.device,
        )
        self.model.bind_kv_caches(list(caches.unbind(0)))
        try:
            with self.lora.base_model_only() if self.lora is not None else nullcontext():
                hidden = self.model(input_ids, positions, metadata)  # [tokens, hidden]
        finally:
            for layer, cache in zip(self.model.attention_layers(), previous):
                layer.kv_cache = cache
        starts = metadata.query_start_loc_cpu
        pooled = []
        for i in range(len(prompts)):
            rows = hidden[starts[i]: starts[i + 1]].float()  # [len_i, hidden]
            pooled.append(rows[-1] if config.pooling_type == "LAST" else rows.mean(dim=0))
        vectors = torch.stack(pooled)  # [prompts, hidden]
        if config.normalize:
            vectors = F.normalize(vectors, p=2, dim=-1)
        return vectors.cpu().tolist()

    def _prefill_inputs(self, prompts: list[Sequence[int]]):
        """A flat prefill batch: prompt i in blocks of its own, contiguous, from slot 0."""
        ids: list[int] = []
        positions: list[int] = []
        starts = [0]
        tables: list[list[int]] = []
        next_block = 0
        for prompt in prompts:
            n_blocks = -(-len(prompt) // self.block_size)
            tables.append(list(range(next_block, next_block + n_blocks)))
            ids += list(prompt)
            positions += range(len(prompt))
            starts.append(len(ids))
            next_block += n_blocks
        slots = [tables[i][p // self.block_size] * self.block_size + p % self.block_size
                 for i, prompt in enumerate(prompts) for p in range(len(prompt))]
        width = max(len(t) for t in tables)
        table_tensor = torch.zeros(len(prompts), width, dtype=torch.int32)
        for i, table in enumerate(tables):
            table_tensor[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        lens = [len(p) for p in prompts]
        metadata = AttentionMetadata(
            num_actual_tokens=len(ids),
            num_seqs=len(prompts),
            max_query_len=max(lens),
            max_seq_len=max(lens),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            block_tables=table_tensor.to(self.device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            query_start_loc_cpu=starts,
            seq_lens_cpu=lens,
            is_decode_only=len(ids) == len(prompts),
        )
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        return input_ids, torch.tensor(positions, dtype=torch.int64, device=self.device), metadata, next_block


def pooler_for_runner(runner) -> Pooler:
    """A Pooler over a ModelRunner's model (used between engine steps only)."""
    spec = runner.kv_spec
    return Pooler(runner.model, (spec.block_size, spec.num_kv_heads, spec.head_dim), spec.dtype,
                  runner.device, runner.config.scheduler.max_num_batched_tokens, lora=runner.lora)
