"""DraftModelProposer: a smaller model of any supported architecture, same vocabulary, drafts k
tokens by greedy autoregression.

Its K/V lives in its own paged cache tensors with the target's block count and block size, and
the target's block tables and slot mapping address both: a request's draft K/V sits in the
same block ids as its target K/V.

On CUDA both halves of the work replay graphs (capture_graphs): the pass over the target's batch
when that batch is a decode or per-token verify batch of a captured size, and the k draft steps
(spec_decode/draft_steps.py). So prefix-cache hits, forks and copy-on-write copies hold
for the draft too (the runner applies each step's block copies and swaps to both caches).

Each step the draft first runs the target's own batch (prompt chunks, decode tokens, the
verified drafts), which writes its K/V exactly where the target's went; the accepted part is
what later steps read. Then, for each request that sampled, it feeds the newest token and its
own k - 1 argmaxes, one decode step at a time, into the lookahead slots past the step that the
scheduler reserved (core/speculation.py). Those slots are rewritten by the next step's batch,
so a rejected draft's K/V is never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from folio.config import ModelConfig
from folio.core.pending_drafts import PendingDrafts
from folio.models.loader import load_model
from folio.sample.transfer import to_device
from folio.spec_decode.device_drafts import DeviceDrafts
from folio.spec_decode.draft_steps import DraftSteps
from folio.spec_decode.proposer import ProposalBatch, Proposer, speculating
from folio.worker import block_ops
from folio.worker import kv_cache as kvc
from folio.worker.cuda_graphs import CudaGraphRunner, graph_batch_sizes
from folio.worker.step_inputs import StepInputBuilder, StepInputs


class DraftModelProposer(Proposer):
    def __init__(
        self,
        config: ModelConfig,
        num_speculative_tokens: int,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
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
        max_blocks = -(-max_model_len // block_size)
        sizes = graph_batch_sizes(max_num_seqs)
        self.steps = DraftSteps(self.model, sizes, num_speculative_tokens, block_size, max_blocks, device)
        self.mirror: CudaGraphRunner | None = None  # made by capture_graphs
        self._observed: StepInputs | None = None  # the batch observe() already ran the draft over

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

    # ---- CUDA graphs ----------------------------------------------------------------------
    def capture_graphs(self, builder: StepInputBuilder, sizes: list[int]) -> None:
        """Graphs of the draft's pass over the target's decode and verify batches (reading the
        target's step buffers) and of its own decode steps (spec_decode/draft_steps.py)."""
        self.mirror = CudaGraphRunner(self.model, builder, sizes)
        self.mirror.capture()
        self.steps.capture()

    # ---- drafting -------------------------------------------------------------------------
    @torch.inference_mode()
    def observe(self, inputs: StepInputs) -> None:
        self._mirror(inputs)  # the draft's K/V of the target's batch, queued behind its forward
        self._observed = inputs

    @torch.inference_mode()
    def propose(self, batch: ProposalBatch) -> dict[int, Sequence[int]]:
        """The drafts stay on the device (PendingDrafts over one DeviceDrafts): nothing here
        waits for the GPU, so the engine's bookkeeping overlaps the k draft steps."""
        if self._observed is not batch.inputs:
            self._mirror(batch.inputs)
        self._observed = None
        indices = speculating(batch)
        if not indices:
            return {}
        positions = [batch.position_of_last(i) for i in indices]
        # Slots the request's table covers (its lookahead included), and never past max_model_len.
        limits = [
            max(0, min(self.k, len(batch.scheduled[i].block_ids) * self.block_size - p, self.max_model_len - p))
            for i, p in zip(indices, positions)
        ]
        steps = max(limits)
        drafts: dict[int, Sequence[int]] = {i: [] for i in indices}
        if steps == 0:
            return drafts
        tokens = to_device([batch.emitted[i][-1] for i in indices], torch.int64, self.device)  # [n]
        tables = [batch.scheduled[i].block_ids for i in indices]
        source = DeviceDrafts(self.steps.run(tokens, positions, tables, limits, steps))  # [steps, n]
        for j, (i, limit) in enumerate(zip(indices, limits)):
            drafts[i] = PendingDrafts(source, j, limit) if limit else []
        return drafts

    def _mirror(self, inputs: StepInputs) -> None:
        """Run the draft over the target's batch, from its decode graph when the batch is one
        (a decode step, or a verify step laid out per token) of a captured size."""
        md = inputs.attn_metadata
        size = inputs.input_ids.shape[0]
        if self.mirror is not None and md.is_decode_only and md.num_seqs == size and self.mirror.bucket_for(size) == size:
            self.mirror.replay(size)
        else:
            self.model(inputs.input_ids, inputs.positions, md)
