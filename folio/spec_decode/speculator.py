"""Speculator: the runner's one handle on speculative decoding — a proposer and the verifier.

Per step, after the target's forward: `verify` turns the rows of requests that carried drafts
into their emitted tokens (spec_decode/verifier.py), then `propose` drafts the next step's
tokens for every request that sampled (spec_decode/proposer.py). Requests without drafts are
sampled by the ordinary sampler, so features that live only there (a grammar's mask) are
untouched; such requests never get drafts (Request.can_speculate).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from folio.config import EngineConfig
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
from folio.logger import init_logger
from folio.spec_decode.device_drafts import fill_pending_drafts
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
        # With the prefix cache, the draft's K/V of requests that may not draft (structured
        # outputs, beams, logits processors) is read too: by a drafting request that later hits
        # their cached blocks (_needs_draft_kv).
        self.prefix_caching = config.cache.enable_prefix_caching
        # Set once decode graphs exist: verify steps of more tokens than the largest graph run
        # eager, slower than the decode steps they replace, so drafting pauses above it.
        self.max_graph_tokens: int | None = None
        self._paused = False
        self._step_paused: bool | None = None  # observe()'s decision for the step in flight
        self._step_drafts = False  # and whether any request of it drafts
        # Requests whose draft K/V misses a paused step's tokens: they never draft again.
        self.stale: set[str] = set()
        self._newly_stale: set[str] = set()  # not yet reported to the scheduler (take_newly_stale)
        logger.info("Speculative decoding: %s, %d tokens per step", spec.method, spec.num_speculative_tokens)

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots past a step the proposer writes its own K/V into (draft models only)."""
        return self.proposer.k if self.proposer.kv_bytes_per_block else 0

    def observe(self, scheduled: list[ScheduledRequest], inputs: StepInputs) -> bool:
        """The step's batch, right after the target's forward is queued: decide whether this
        step drafts (_pause_for), and if it does not, skip a draft model's pass over the batch
        too, so that a paused speculator costs (nearly) nothing. Its K/V then misses this step's
        tokens, so every request in the batch becomes stale: it runs to the end without drafts
        (new requests draft again once the pause ends). Returns whether the step proposes
        drafts: a step that does not needs no tokens on the host and may run ahead (async
        scheduling, engine/llm_engine.py)."""
        sampling = [*inputs.sampling_batch_indices, *inputs.verify_batch_indices]
        if self.disable_by_batch_size is not None and len(sampling) >= self.disable_by_batch_size:
            drafting = 0  # paused whoever may draft: no scan of the batch
            self._step_paused = True
        else:
            drafting = sum(1 for i in sampling if self._may_draft(scheduled[i]))
            self._step_paused = self._pause_for(len(sampling), drafting)
        if self._step_paused and self.proposer.kv_bytes_per_block:
            fresh = {s.request_id for s in scheduled} - self.stale
            self.stale |= fresh
            self._newly_stale |= fresh
        elif any(self._needs_draft_kv(s) for s in scheduled):  # else no one would read it
            self.proposer.observe(inputs)
        self._step_drafts = not self._step_paused and drafting > 0
        return self._step_drafts

    @property
    def observed(self) -> bool:
        """Whether observe() saw the step that propose() has not finished yet."""
        return self._step_paused is not None

    @property
    def step_drafts(self) -> bool:
        """Whether the step observe() saw last (not yet proposed for) drafts."""
        return self._step_paused is False and self._step_drafts

    def fill_drafts(self, inputs: StepInputs) -> None:
        """Write drafts still on the device into the step's input ids (before its forward)."""
        fill_pending_drafts(inputs.input_ids, inputs.pending_drafts)

    def take_newly_stale(self) -> frozenset[str]:
        """Requests made stale since the last call: the step's output tells the scheduler,
        which then stops reserving lookahead slots for them."""
        fresh, self._newly_stale = frozenset(self._newly_stale), set()
        return fresh

    def forget(self, request_ids: Iterable[str]) -> None:
        """Requests that finished: nothing to remember about them."""
        self.stale.difference_update(request_ids)
        self._newly_stale.difference_update(request_ids)
        self.proposer.forget(request_ids)

    def _may_draft(self, sched: ScheduledRequest) -> bool:
        return sched.request_id not in self.stale and sched.request.can_speculate

    def _needs_draft_kv(self, sched: ScheduledRequest) -> bool:
        """Whether the draft's K/V of the request's tokens may be read: by its own drafts or,
        with the prefix cache, by any later request that hits its blocks (one that may not draft
        itself too: without this pass a drafting request reusing, say, a structured output's
        prompt read garbage K/V, and nearly all its drafts were rejected). Never for a stale
        request: its draft K/V already misses a paused step's tokens."""
        if sched.request_id in self.stale:
            return False
        return self.prefix_caching or sched.request.can_speculate

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
    ) -> list[Sequence[int]]:
        """Drafts for every scheduled request, [] for those that get none (a draft model's
        are PendingDrafts: their values still on the device)."""
        paused, self._step_paused = self._step_paused, None  # observe() ran for this step
        emitted = {i: tokens for i, tokens in emitted.items() if self._may_draft(scheduled[i])}
        if paused or not emitted:
            return [[] for _ in scheduled]
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
                "CUDA graph (%d tokens)%s",
                "paused" if too_big else "resumed", batch_size, drafting, self.proposer.k, tokens,
                "more than" if too_big else "within", self.max_graph_tokens,
                "; the draft model skips the batch, whose requests finish without drafts"
                if too_big and self.proposer.kv_bytes_per_block else "",
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
