"""Helpers for the sampler tests: batch rows and one sampling step on the CPU."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from folio.sample import Sampler, SamplerOutput, SamplingMetadata, SamplingRow
from folio.sample import make_request_generator
from folio.sampling_params import SamplingParams

CPU = torch.device("cpu")


def make_row(
    params: SamplingParams | None = None,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    **param_fields,
) -> SamplingRow:
    """A row as the model runner builds it: a fresh generator for seeded, non-greedy params."""
    params = params if params is not None else SamplingParams(**param_fields)
    generator = None
    if params.seed is not None and not params.sampling_type_greedy:
        generator = make_request_generator(params.seed, CPU)
    return SamplingRow(params, list(prompt), list(output), generator)


def sample(
    rows: Sequence[SamplingRow], logits: torch.Tensor, sampler: Sampler | None = None
) -> SamplerOutput:
    metadata = SamplingMetadata.build(rows, logits.shape[-1], CPU)
    return (sampler or Sampler(0, CPU))(logits, metadata)
