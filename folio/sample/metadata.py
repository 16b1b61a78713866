"""SamplingMetadata: one step's sampling parameters as device tensors, built from the batch rows.

Every optional stage is None when no row in the batch uses it, so the sampler can skip it
without looking at the tensors: the flags are decided here, on the host, once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from folio.sample.constraints import TokenConstraints
from folio.sample.logits_processors import LogitsProcessors
from folio.sample.grammar_mask import GrammarMask
from folio.sample.penalties import PenaltyTensors
from folio.sample.transfer import to_device
from folio.sampling_params import SamplingParams
from folio.structured_output.backend import GrammarState


@dataclass
class SamplingRow:
    """One request's row in this step's batch."""

    params: SamplingParams
    prompt_token_ids: list[int]
    # Generated so far, for penalties. With async scheduling the last of them may still be on
    # its way (a placeholder): requests with penalties never overlap steps (Request.
    # needs_sync_steps), so for them the list is complete.
    output_token_ids: list[int]
    generator: torch.Generator | None  # per-request generator when params.seed is set, else None
    # Outputs before the one this step samples (for min_tokens), placeholders included.
    num_output_tokens: int
    # Structured outputs: fills the row's mask of allowed tokens. The engine samples such a
    # step only after the previous step's update, so the state has seen every output token.
    grammar: GrammarState | None = None


@dataclass
class SamplingMetadata:
    num_rows: int
    all_greedy: bool  # every row takes the argmax: nothing random happens this step
    all_random: bool  # no row is greedy
    # None unless the batch mixes greedy and random rows.
    greedy_mask: torch.Tensor | None  # [rows] bool
    # The sampling stages below are None when all_greedy or when no row uses them.
    temperature: torch.Tensor | None  # [rows] float32, 1.0 on greedy rows; None: all 1.0
    min_p: torch.Tensor | None  # [rows] float32, 0 = off
    top_k: torch.Tensor | None  # [rows] int64 in [1, vocab], vocab = off
    max_top_k: int  # largest top_k in use (< vocab), 0 when top_k is None
    top_p: torch.Tensor | None  # [rows] float32 in (0, 1], 1 = off
    # Rows that draw their noise from their own generator (seeded, not greedy).
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None  # None: no row asked for logprobs
    constraints: TokenConstraints | None  # allowed_token_ids, min_tokens, logit_bias
    penalties: PenaltyTensors | None
    logits_processors: LogitsProcessors | None = None  # vLLM's per-request callables
    grammar_mask: GrammarMask | None = None  # structured outputs; applied before everything

    @property
    def edits_logits(self) -> bool:
        """Whether any stage changes the logits before the argmax or the draw."""
        return any(
            stage is not None
            for stage in (
                self.grammar_mask,
                self.constraints,
                self.logits_processors,
                self.penalties,
                self.temperature,
                self.min_p,
                self.top_k,
                self.top_p,
            )
        )

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
    ) -> SamplingMetadata:
        params = [r.params for r in rows]
        greedy = [p.sampling_type_greedy for p in params]
        all_greedy, all_random = all(greedy), not any(greedy)
        requested = [p.logprobs for p in params if p.logprobs is not None]
        metadata = cls(
            num_rows=len(rows),
            all_greedy=all_greedy,
            all_random=all_random,
            greedy_mask=None,
            temperature=None,
            min_p=None,
            top_k=None,
            max_top_k=0,
            top_p=None,
            generators={},
            max_num_logprobs=max(requested) if requested else None,
            constraints=TokenConstraints.build(rows, vocab_size, device),
            penalties=PenaltyTensors.build(rows, vocab_size, device),
            logits_processors=LogitsProcessors.build(rows),
            grammar_mask=GrammarMask.build(rows, vocab_size, device),
        )
        if not all_greedy:
            metadata._fill_random_stages(rows, greedy, vocab_size, device)
        return metadata

    def _fill_random_stages(
        self,
        rows: Sequence[SamplingRow],
        greedy: list[bool],
        vocab_size: int,
        device: torch.device,
    ) -> None:
        params = [r.params for r in rows]
        if not self.all_random:
            self.greedy_mask = to_device(greedy, torch.bool, device)
        # Greedy rows divide by 1 and keep their (neutral) truncations: their random draw is
        # thrown away, and neutral values keep them from turning a row into -inf / NaN.
        temperature = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        if any(t != 1.0 for t in temperature):
            self.temperature = to_device(temperature, torch.float32, device)
        min_p = [p.min_p for p in params]
        if any(m > 0.0 for m in min_p):
            self.min_p = to_device(min_p, torch.float32, device)
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        in_use = [k for k in top_k if k < vocab_size]
        if in_use:
            self.top_k = to_device(top_k, torch.int64, device)
            self.max_top_k = max(in_use)
        top_p = [p.top_p for p in params]
        if any(v < 1.0 for v in top_p):
            self.top_p = to_device(top_p, torch.float32, device)
        self.generators = {
            i: r.generator for i, r in enumerate(rows) if r.generator is not None and not greedy[i]
        }
