"""PenaltyTensors: repetition, frequency and presence penalties, vLLM's (and OpenAI's) formulas.

- repetition (> 0, 1 = off), over prompt and output tokens: a seen token's logit is divided by
  the penalty when positive and multiplied by it when negative, so a penalty > 1 always makes
  it less likely.
- frequency (f) and presence (p), over output tokens only:
  logit -= f * count(token in output) + p * (count > 0).

Only the rows that use some penalty get count tensors ([p, vocab], not [rows, vocab]), and only
rows with a repetition penalty contribute their prompt tokens: the host-to-device traffic and
the memory scale with the users of the feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from folio.sample.transfer import flat_token_ids, to_device

if TYPE_CHECKING:
    from folio.sample.metadata import SamplingRow


@dataclass
class PenaltyTensors:
    rows: torch.Tensor | None  # [p] int64 batch rows with a penalty; None: every row has one
    output_counts: torch.Tensor  # [p, vocab] float32: occurrences of each token in the output
    prompt_seen: torch.Tensor | None  # [p, vocab] bool: token is in the prompt; None: no repetition
    repetition: torch.Tensor | None  # [p, 1] float32; None when every row's is 1
    frequency: torch.Tensor | None  # [p, 1] float32; None when every row's is 0
    presence: torch.Tensor | None  # [p, 1] float32; None when every row's is 0

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
    ) -> PenaltyTensors | None:
        """None when no row uses a penalty: the sampler then does no penalty work at all."""
        chosen = [i for i, r in enumerate(rows) if _uses_penalties(r)]
        if not chosen:
            return None
        picked = [rows[i] for i in chosen]
        if any(len(r.output_token_ids) != r.num_output_tokens for r in picked):
            # Placeholders: the engine must not overlap steps of requests with penalties.
            raise RuntimeError("Penalties need every output token on the host before sampling.")
        repetition = [r.params.repetition_penalty for r in picked]
        frequency = [r.params.frequency_penalty for r in picked]
        presence = [r.params.presence_penalty for r in picked]
        counts = _token_counts([r.output_token_ids for r in picked], vocab_size, device)
        prompt_seen = None
        if any(v != 1.0 for v in repetition):
            # Rows whose repetition penalty is 1 would divide by 1: their prompts are left out.
            prompts = [r.prompt_token_ids if v != 1.0 else [] for r, v in zip(picked, repetition)]
            prompt_seen = _token_counts(prompts, vocab_size, device) > 0  # [p, vocab]
        return cls(
            rows=None if len(chosen) == len(rows) else _long(chosen, device),
            output_counts=counts,
            prompt_seen=prompt_seen,
            repetition=_column(repetition, 1.0, device),
            frequency=_column(frequency, 0.0, device),
            presence=_column(presence, 0.0, device),
        )

    def apply(self, logits: torch.Tensor) -> None:
        """Edit logits [rows, vocab] float32 in place."""
        x = logits if self.rows is None else logits[self.rows]  # [p, vocab]
        in_output = self.output_counts > 0  # [p, vocab]
        if self.repetition is not None:
            seen = in_output if self.prompt_seen is None else in_output | self.prompt_seen
            penalty = torch.where(seen, self.repetition, 1.0)  # [p, vocab]
            x = torch.where(x > 0, x / penalty, x * penalty)
        if self.frequency is not None:
            x = x - self.frequency * self.output_counts
        if self.presence is not None:
            x = x - self.presence * in_output.float()
        if self.rows is None:
            logits.copy_(x)
        else:
            logits[self.rows] = x


def _uses_penalties(row: SamplingRow) -> bool:
    p = row.params
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def _token_counts(
    token_lists: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[len(token_lists), vocab] float32: how often each token id occurs in each list."""
    flat = flat_token_ids(token_lists, device)  # [total]
    lengths = _long([len(t) for t in token_lists], device)  # [lists]
    # output_size is known on the host: without it repeat_interleave waits for the device.
    rows = torch.arange(len(token_lists), device=device)
    row_of = torch.repeat_interleave(rows, lengths, output_size=flat.numel())  # [total]
    counts = torch.zeros(len(token_lists), vocab_size, dtype=torch.float32, device=device)
    counts.index_put_((row_of, flat), torch.ones_like(flat, dtype=torch.float32), accumulate=True)
    return counts


def _column(values: list[float], neutral: float, device: torch.device) -> torch.Tensor | None:
    if all(v == neutral for v in values):
        return None
    return to_device(values, torch.float32, device).unsqueeze(1)  # [p, 1]


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.int64, device)
