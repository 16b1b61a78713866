"""Speculator: the runner's one handle on speculative decoding — a proposer and the verifier.

Per step, after the target's forward: `verify` turns the rows of requests that carried drafts
into their emitted tokens (spec_decode/verifier.py), then `propose` drafts the next step's
tokens for every request that sampled (spec_decode/proposer.py). Requests without drafts are
sampled by the ordinary sampler, so features that live only there (a grammar's mask) are
untouched; such requests never get drafts (Request.can_speculate).
"""

from __future__ import annotations

import torch

from folio.config import EngineConfig
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
from folio.logger import init_logger
from folio.spec_decode.proposer import ProposalBatch, Proposer
from folio.spec_decode.verifier import GeneratorFor, SpecVerifier, VerifiedTokens
from folio.worker.step_inputs import StepInputBuilder, StepInputs

logger = init_logger(__name__)


def make_proposer(config: EngineConfig, device: torch.device, attn_backend) -> Proposer:  # noqa: ANN001
    spec = config.speculative
    assert spec is not None
    if spec.method == "ngram":
        from folio.spec_decode.ngram import NgramProposer

        return NgramProposer(spec)
    from folio.spec_decode.draft_model import DraftModelProposer

    assert config.draft_model is not None
    return DraftModelProposer(
        config.draft_model,
        spec.num_speculative_tokens,
        config.cache.block_size,
        config.model.max_model_len,
        config.scheduler.max_num_seqs,
        device,
        attn_backend,
    )


class Speculator:
    def __init__(self, config: EngineConfig, device: torch.device, attn_backend) -> None:  # noqa: ANN001
        self.proposer = make_proposer(config, device, attn_backend)
        self.verifier = SpecVerifier(config.model.vocab_size, config.model.seed, device)
        spec = config.speculative
        assert spec is not None
        self.disable_by_batch_size = spec.disable_by_batch_size
        # Set once decode graphs exist: verify steps of more tokens than the largest graph run
        # eager, slower than the decode steps they replace, so drafting pauses above it.
        self.max_graph_tokens: int | None = None
        self._paused = False
        logger.info("Speculative decoding: %s, %d tokens per step", spec.method, spec.num_speculative_tokens)

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots past a step the proposer writes its own K/V into (draft models only)."""
        return self.proposer.k if self.proposer.kv_bytes_per_block else 0

    def observe(self, inputs: StepInputs) -> None:
        """The step's batch, right after the target's forward is queued (Proposer.observe)."""
        self.proposer.observe(inputs)

    def verify(
        self,
        logits: torch.Tensor,  # [rows, vocab], k_i + 1 rows per request
        scheduled: list[ScheduledRequest],
        generator_for: GeneratorFor,
    ) -> VerifiedTokens:
        return self.verifier.verify(logits, scheduled, generator_for)

    def propose(
        self,
        scheduled: list[ScheduledRequest],
        inputs: StepInputs,
        hidden: torch.Tensor,
        emitted: dict[int, list[int]],
    ) -> list[list[int]]:
        """Drafts for every scheduled request, [] for those that get none."""
        drafting = sum(1 for i in emitted if scheduled[i].request.can_speculate)
        if self._pause_for(len(emitted), drafting):
            # A draft model's K/V of this batch is still written: later steps may draft again.
            emitted = {}
        drafts = self.proposer.propose(ProposalBatch(scheduled, inputs, hidden, emitted))
        return [drafts.get(i, []) for i in range(len(scheduled))]

    def _pause_for(self, batch_size: int, num_drafting: int | None = None) -> bool:
        """No drafts for this batch: the user's disable_by_batch_size, or a next verify step
        (1 + k tokens per drafting request, 1 per other one: num_drafting defaults to all of
        batch_size) that no decode graph holds (logged when that starts and ends). A step where
        nothing sampled (prompt chunks only) says nothing about the next one: the pause stays."""
        if self.disable_by_batch_size is not None and batch_size >= self.disable_by_batch_size:
            return True
        if batch_size == 0:
            return self._paused
        drafting = batch_size if num_drafting is None else num_drafting
        tokens = batch_size + drafting * self.proposer.k
        too_big = self.max_graph_tokens is not None and tokens > self.max_graph_tokens
        if too_big != self._paused:
            self._paused = too_big
            logger.info(
                "Speculative decoding %s: %d requests (%d drafting %d tokens) verify %d tokens, %s the largest "
                "CUDA graph (%d tokens)",
                "paused" if too_big else "resumed", batch_size, drafting, self.proposer.k, tokens,
                "more than" if too_big else "within", self.max_graph_tokens,
            )
        return too_big

    def initialize_kv_cache(self, num_blocks: int, num_cpu_blocks: int) -> None:
        self.proposer.initialize_kv_cache(num_blocks, num_cpu_blocks)

    def move_blocks(self, scheduler_output: SchedulerOutput) -> None:
        self.proposer.move_blocks(scheduler_output)

    def capture_graphs(self, builder: StepInputBuilder, sizes: list[int]) -> None:
        """The proposer's CUDA graphs, after the target's (the runner's step buffers and sizes)."""
        self.proposer.capture_graphs(builder, sizes)
        self.max_graph_tokens = max(sizes)
