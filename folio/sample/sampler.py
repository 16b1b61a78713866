"""Sampler: one step's logits to one token per row, on the logits' device, vLLM v1's order.

1. Log-probs of the raw logits, when some row asked (max over the rows' `logprobs`).
2. In float32: the structured-output grammar mask, allowed_token_ids, min_tokens and bad_words
   bans, logit_bias, vLLM's logits processors (per-request callables), then penalties.
3. Greedy rows take the argmax here (all-greedy batches stop here); on CUDA a single row (batch-1
   decode) takes the split kernel (folio/kernels/argmax.py), not torch's one block per row.
4. Temperature, min_p, top-k, top-p, then a draw by exponential race.

On CUDA the draw is one fused kernel (folio/kernels/gumbel_sample.py): temperature and the race
in log space (Gumbel-max) in one pass over the logits, noise from Philox keyed by one seed per
row, so nothing of size vocab is allocated and nothing goes through the host. Rows using min_p,
top-k or top-p are truncated first (torch, as on the CPU) and then drawn by the same kernel. A
seeded row's Philox key is drawn from its own generator each step; the other rows' keys come
from the sampler's generator in one call. The CPU keeps the torch race below.

The exponential race: argmax(p / E) with E ~ Exponential(1) i.i.d. picks token i with
probability p_i (E_i / p_i is Exponential(p_i), and the smallest of independent exponentials
is i with probability p_i / sum p). It needs one noise value per token and no host round trip,
and it lets a seeded row draw its noise from its own generator only: its tokens depend on its
seed and its own logits, never on what else is in the batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from folio.kernels.argmax import argmax_rows
from folio.kernels.gumbel_sample import gumbel_sample
from folio.kernels.triton_compat import use_triton_for
from folio.sample.logprobs import compute_logprobs, gather_from_logprobs, gather_logprobs
from folio.sample.metadata import SamplingMetadata
from folio.sample.truncation import apply_min_p, apply_top_k_top_p

_SEED_BOUND = 1 << 62

__all__ = ["Sampler", "SamplerOutput", "gather_logprobs", "make_request_generator"]


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [rows] int64
    # Sampled token first, then the top max_num_logprobs; None when no row asked for logprobs.
    logprob_token_ids: torch.Tensor | None  # [rows, max_logprobs + 1] int64
    logprobs: torch.Tensor | None  # [rows, max_logprobs + 1] float32
    sampled_ranks: torch.Tensor | None  # [rows] int64, 1 = most likely


def make_request_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator a seeded request draws all its noise from, for its whole life."""
    return torch.Generator(device=device).manual_seed(seed)


class Sampler:
    def __init__(self, seed: int, device: torch.device, fused: bool | None = None) -> None:
        """fused: draw with the fused Triton kernel (None: on CUDA when the Triton kernels are on
        and FOLIO_FUSED_SAMPLING is not "0"; True on the CPU runs it through Triton's
        interpreter, for tests)."""
        # Noise for every row without its own generator, drawn in one batched call per step.
        self.generator = make_request_generator(seed, device)
        if fused is None and os.environ.get("FOLIO_FUSED_SAMPLING", "1") == "0":
            fused = False
        self.fused = fused

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of logits [rows, vocab], of any float dtype (the runner passes
        the LM head's own: the argmax and the Gumbel draw read 16-bit logits exactly, and every
        stage that edits or rescales them works on a float32 copy). The input is left unchanged."""
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            raw_logprobs = compute_logprobs(logits)  # [rows, vocab]
        owned = (
            metadata.grammar_mask is not None
            or metadata.constraints is not None
            or metadata.logits_processors is not None
            or metadata.penalties is not None
        )
        if owned:
            logits = logits.to(torch.float32, copy=True)  # every stage below edits in place
            if metadata.grammar_mask is not None:
                metadata.grammar_mask.apply(logits)
            if metadata.constraints is not None:
                metadata.constraints.apply(logits)
            if metadata.logits_processors is not None:
                metadata.logits_processors.apply(logits)
            if metadata.penalties is not None:
                metadata.penalties.apply(logits)
        sampled = self._sample(logits, metadata, owned)  # [rows]
        if raw_logprobs is None:
            return SamplerOutput(sampled, None, None, None)
        ids, values, ranks = gather_from_logprobs(raw_logprobs, sampled, metadata.max_num_logprobs)
        return SamplerOutput(sampled, ids, values, ranks)

    def _sample(self, logits: torch.Tensor, metadata: SamplingMetadata, owned: bool) -> torch.Tensor:
        """owned: logits is this step's own copy, free to edit in place."""
        if metadata.all_greedy:
            return argmax_rows(logits)
        greedy = None if metadata.all_random else argmax_rows(logits)  # [rows]
        if self.fused if self.fused is not None else use_triton_for(logits):
            sampled = self._fused_draw(logits, metadata, owned)  # [rows]
        else:
            logits = self._truncated(logits, metadata, metadata.temperature, owned)
            sampled = self._race(logits.softmax(dim=-1), metadata.generators)  # [rows]
        if greedy is None:
            return sampled
        return torch.where(metadata.greedy_mask, greedy, sampled)

    def _truncated(
        self, logits: torch.Tensor, metadata: SamplingMetadata, temperature: torch.Tensor | None, owned: bool
    ) -> torch.Tensor:
        """float32 logits divided by temperature (when given), then min_p, top-k, top-p."""
        logits = logits.to(torch.float32, copy=not owned)
        if temperature is not None:
            logits.div_(temperature.unsqueeze(1))
        if metadata.min_p is not None:
            apply_min_p(logits, metadata.min_p)
        if metadata.top_k is not None or metadata.top_p is not None:
            apply_top_k_top_p(logits, metadata.top_k, metadata.top_p, metadata.max_top_k)
        return logits

    def _fused_draw(self, logits: torch.Tensor, metadata: SamplingMetadata, owned: bool) -> torch.Tensor:
        """Temperature + Gumbel-max in one kernel; truncations (if any) run first, in torch."""
        temperature = metadata.temperature
        if metadata.min_p is not None or metadata.top_k is not None or metadata.top_p is not None:
            logits = self._truncated(logits, metadata, temperature, owned)
            temperature = None  # already applied: top-p measures the tempered distribution
        seeds = self._row_seeds(logits.shape[0], metadata.generators, logits.device)
        return gumbel_sample(logits, seeds, temperature)

    def _row_seeds(
        self, rows: int, generators: dict[int, torch.Generator], device: torch.device
    ) -> torch.Tensor:
        """[rows] int64 Philox keys: one batched draw, then each seeded row's from its generator."""
        seeds = torch.randint(0, _SEED_BOUND, (rows,), generator=self.generator, device=device)
        for row, generator in generators.items():
            seeds[row : row + 1].random_(0, _SEED_BOUND, generator=generator)
        return seeds

    def _race(self, probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
        """argmax(probs / Exponential(1) noise) per row; edits probs [rows, vocab] in place."""
        noise = torch.empty_like(probs)  # [rows, vocab]
        if len(generators) < probs.shape[0]:
            noise.exponential_(generator=self.generator)
        # The only per-row loop: each seeded row overwrites its noise from its own generator.
        for row, generator in generators.items():
            noise[row].exponential_(generator=generator)
        # A zero draw would turn a zero-probability token into 0/0 = NaN, which argmax picks.
        noise.clamp_min_(torch.finfo(noise.dtype).tiny)
        return probs.div_(noise).argmax(dim=-1)
