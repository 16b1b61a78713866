"""Pooler: embeddings from a decoder model's final hidden states, as vLLM's embedding runner makes
them for a *ForCausalLM checkpoint (last-token pooling, L2-normalized, by default; mean pooling
on request).

Each call runs prefill forwards over batches of prompts. Their K/V go to blocks borrowed from the
engine's own KV cache (free blocks, taken from the engine's BlockPool for the forward and given
back right after, between two steps), so the pooler needs no memory beyond what the GPU memory
profile measured: a batch holds at most max_num_batched_tokens tokens and max_num_seqs prompts,
like the profiled step. Only a prompt needing more blocks than are free at that moment (a full
cache) runs over a scratch cache of its own, with a warning; and a prompt longer than
max_num_batched_tokens runs in one forward, larger than the profiled step (a warning too).
docs/serving.md, "Embeddings and GPU memory".
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from folio.attention.metadata import AttentionMetadata
from folio.core.block_pool import BlockPool
from folio.logger import init_logger
from folio.models.base import CausalLM
from folio.pooling_params import PoolerConfig

logger = init_logger(__name__)


class Pooler:
    def __init__(self, model: CausalLM, kv_shape: tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device, max_batch_tokens: int, lora=None, *,
                 max_batch_prompts: int | None = None, block_pool: BlockPool | None = None) -> None:
        """kv_shape: (block_size, num_kv_heads, head_dim) of the model's attention layers.
        lora: the runner's LoRAManager when adapters are enabled (pooling runs the base model).
        block_pool: the engine's, whose free blocks of the model's bound KV cache the forwards
        borrow; None: every batch runs over a scratch cache of its own."""
        self.model = model
        self.block_size, self.num_kv_heads, self.head_dim = kv_shape
        self.dtype = dtype
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_prompts = max_batch_prompts
        self.block_pool = block_pool
        self.lora = lora

    @torch.inference_mode()
    def embed(self, prompts: Sequence[Sequence[int]], config: PoolerConfig) -> list[list[float]]:
        """One embedding per prompt (token ids), in order."""
        out: list[list[float]] = []
        for batch in self._batches(prompts):
            out.extend(self._embed_batch(batch, config))
        return out

    def _blocks(self, prompt: Sequence[int]) -> int:
        return -(-len(prompt) // self.block_size)

    def _batches(self, prompts: Sequence[Sequence[int]]) -> list[list[Sequence[int]]]:
        """Prompts in order, in batches of at most max_batch_tokens tokens, max_batch_prompts
        prompts and (borrowing) the engine's free blocks; a prompt over a limit is a batch alone."""
        free = self.block_pool.num_free_blocks if self._borrows() else None
        batches: list[list[Sequence[int]]] = [[]]
        tokens = blocks = 0
        for prompt in prompts:
            full = (tokens + len(prompt) > self.max_batch_tokens
                    or (self.max_batch_prompts is not None and len(batches[-1]) >= self.max_batch_prompts)
                    or (free is not None and blocks + self._blocks(prompt) > free))
            if batches[-1] and full:
                batches.append([])
                tokens = blocks = 0
            batches[-1].append(prompt)
            tokens += len(prompt)
            blocks += self._blocks(prompt)
        return [b for b in batches if b]

    def _borrows(self) -> bool:
        """Whether the model's attention layers have the engine's KV cache bound to borrow from."""
        layers = self.model.attention_layers()
        return self.block_pool is not None and bool(layers) and layers[0].kv_cache is not None

    def _embed_batch(self, prompts: list[Sequence[int]], config: PoolerConfig) -> list[list[float]]:
        num_blocks = sum(self._blocks(p) for p in prompts)
        if len(prompts) == 1 and len(prompts[0]) > self.max_batch_tokens:
            logger.warning(
                "Embedding a %d-token prompt in one forward: more tokens than max_num_batched_tokens "
                "(%d), so its activations are outside the GPU memory profile.",
                len(prompts[0]), self.max_batch_tokens,
            )
        borrowed: list[int] | None = None
        if self._borrows() and self.block_pool.can_allocate(num_blocks):  # type: ignore[union-attr]
            borrowed = self.block_pool.allocate(num_blocks)  # type: ignore[union-attr]
        try:
            block_ids = borrowed if borrowed is not None else list(range(num_blocks))
            input_ids, positions, metadata = self._prefill_inputs(prompts, block_ids)
            if borrowed is not None:  # the engine's cache, bound already
                hidden = self._forward(input_ids, positions, metadata)
            else:
                hidden = self._forward_over_scratch(input_ids, positions, metadata, num_blocks)
        finally:
            if borrowed is not None:  # nothing reads them after this call: the forward is queued first
                self.block_pool.free(borrowed)  # type: ignore[union-attr]
        starts = metadata.query_start_loc_cpu
        pooled = []
        for i in range(len(prompts)):
            rows = hidden[starts[i]: starts[i + 1]].float()  # [len_i, hidden]
            pooled.append(rows[-1] if config.pooling_type == "LAST" else rows.mean(dim=0))
        vectors = torch.stack(pooled)  # [prompts, hidden]
        if config.normalize:
            vectors = F.normalize(vectors, p=2, dim=-1)
        return vectors.cpu().tolist()

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        with self.lora.base_model_only() if self.lora is not None else nullcontext():
            return self.model(input_ids, positions, metadata)  # [tokens, hidden]

    def _forward_over_scratch(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata,
                              num_blocks: int) -> torch.Tensor:
        """The forward over a cache of its own (no engine cache, or too few free blocks in it),
        the model's own cache views rebound after."""
        previous = [layer.kv_cache for layer in self.model.attention_layers()]
        shape = (len(previous), 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        if self.block_pool is not None:
            logger.warning(
                "Embedding %d tokens over a scratch KV cache of %.1f MiB outside the GPU memory profile: "
                "the engine's KV cache has %d free blocks, the batch needs %d.",
                int(input_ids.shape[0]), torch.Size(shape).numel() * self.dtype.itemsize / 2**20,
                self.block_pool.num_free_blocks, num_blocks,
            )
        caches = torch.empty(shape, dtype=self.dtype, device=self.device)  # every read slot is written
        self.model.bind_kv_caches(list(caches.unbind(0)))
        try:
            return self._forward(input_ids, positions, metadata)
        finally:
            for layer, cache in zip(self.model.attention_layers(), previous):
                layer.kv_cache = cache

    def _prefill_inputs(self, prompts: list[Sequence[int]], block_ids: Sequence[int]):
        """A flat prefill batch: prompt i in blocks of its own (the next ones of block_ids), from slot 0."""
        ids: list[int] = []
        positions: list[int] = []
        starts = [0]
        tables: list[list[int]] = []
        next_block = 0
        for prompt in prompts:
            n_blocks = self._blocks(prompt)
            tables.append(list(block_ids[next_block: next_block + n_blocks]))
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
        return input_ids, torch.tensor(positions, dtype=torch.int64, device=self.device), metadata


def pooler_for_runner(runner, block_pool: BlockPool | None = None) -> Pooler:
    """A Pooler over a ModelRunner's model (used between engine steps only), borrowing free
    blocks of block_pool (the engine scheduler's) in the runner's KV cache."""
    spec = runner.kv_spec
    sched = runner.config.scheduler
    return Pooler(runner.model, (spec.block_size, spec.num_kv_heads, spec.head_dim), spec.dtype,
                  runner.device, sched.max_num_batched_tokens, lora=runner.lora,
                  max_batch_prompts=sched.max_num_seqs, block_pool=block_pool)
