"""Helpers for the sampler tests: batch rows and one sampling step on the CPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from folio.sample import Sampler, SamplerOutput, SamplingMetadata, SamplingRow
from folio.sample import make_request_generator
from folio.sampling_params import SamplingParams

CPU = torch.device("cpu")


def make_row(
    params: SamplingParams | None = None,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    device: torch.device = CPU,
    **param_fields,
) -> SamplingRow:
    """A row as the model runner builds it: a fresh generator for seeded, non-greedy params."""
    params = params if params is not None else SamplingParams(**param_fields)
    generator = None
    if params.seed is not None and not params.sampling_type_greedy:
        generator = make_request_generator(params.seed, device)
    return SamplingRow(params, list(prompt), list(output), generator, len(output))


def sample(
    rows: Sequence[SamplingRow], logits: torch.Tensor, sampler: Sampler | None = None
) -> SamplerOutput:
    """One step on the logits' device."""
    metadata = SamplingMetadata.build(rows, logits.shape[-1], logits.device)
    return (sampler or Sampler(0, logits.device))(logits, metadata)


def step_logits(rows: int, vocab: int, seed: int, device: torch.device = CPU) -> torch.Tensor:
    """[rows, vocab] logits made on the CPU (the same numbers on every device), then moved."""
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2).to(device)


def decode_seeded(
    fields: dict,
    steps: int,
    others_for_step: Callable[[int], list[SamplingRow]],
    sampler_seed: int,
    vocab: int,
    device: torch.device = CPU,
) -> list[int]:
    """Decode `steps` tokens of one seeded request whose row sits among other rows each step.

    The seeded row's logits depend on the step only; its position moves from step to step.
    """
    seeded = make_row(SamplingParams(**fields), prompt=[1, 2, 3], device=device)
    sampler = Sampler(sampler_seed, device)
    tokens: list[int] = []
    for step in range(steps):
        seeded.output_token_ids, seeded.num_output_tokens = list(tokens), len(tokens)
        others = others_for_step(step)
        position = step % (len(others) + 1)
        rows = others[:position] + [seeded] + others[position:]
        logits = step_logits(len(rows), vocab, 1000 + step, device)
        logits[position] = step_logits(1, vocab, step, device)[0]
        out = sample(rows, logits, sampler)
        tokens.append(out.sampled_token_ids[position].item())
    return tokens
