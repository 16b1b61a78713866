"""Penalties against a plain-loop computation of vLLM's / OpenAI's formulas."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from folio.sample.penalties import PenaltyTensors
from tests.sample.rows import CPU, make_row, sample

VOCAB = 12


def _reference(logits: np.ndarray, row) -> np.ndarray:
    """One row, one token at a time, written from the formulas."""
    p = row.params
    out = logits.astype(np.float64).copy()
    for t in range(len(out)):
        count = row.output_token_ids.count(t)
        if t in row.prompt_token_ids or count > 0:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
        out[t] -= p.frequency_penalty * count
        if count > 0:
            out[t] -= p.presence_penalty
    return out


def _penalised(rows, logits: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    penalties = PenaltyTensors.build(rows, VOCAB, CPU)
    if penalties is not None:
        penalties.apply(out)
    return out


def _random_rows(rng: random.Random, count: int) -> list:
    rows = []
    for _ in range(count):
        kind = rng.choice(["none", "rep", "freq", "pres", "all"])
        fields = {
            "rep": {"repetition_penalty": rng.uniform(0.5, 2.0)},
            "freq": {"frequency_penalty": rng.uniform(-2.0, 2.0)},
            "pres": {"presence_penalty": rng.uniform(-2.0, 2.0)},
            "all": {
                "repetition_penalty": rng.uniform(0.5, 2.0),
                "frequency_penalty": rng.uniform(-2.0, 2.0),
                "presence_penalty": rng.uniform(-2.0, 2.0),
            },
            "none": {},
        }[kind]
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))]
        output = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 10))]
        rows.append(make_row(prompt=prompt, output=output, **fields))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_penalties_match_the_formulas(seed):
    rng = random.Random(seed)
    rows = _random_rows(rng, rng.randint(1, 6))
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(seed))
    out = _penalised(rows, logits)
    for r, row in enumerate(rows):
        expected = _reference(logits[r].numpy(), row)
        np.testing.assert_allclose(out[r].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_every_row_penalised_takes_the_all_rows_path():
    rows = [
        make_row(prompt=[1, 2], output=[2, 2, 5], frequency_penalty=0.5),
        make_row(prompt=[3], output=[3, 4], repetition_penalty=1.5, presence_penalty=1.0),
    ]
    penalties = PenaltyTensors.build(rows, VOCAB, CPU)
    assert penalties is not None and penalties.rows is None
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    out = _penalised(rows, logits)
    for r, row in enumerate(rows):
        np.testing.assert_allclose(out[r].numpy(), _reference(logits[r].numpy(), row), atol=1e-5)


def test_no_penalty_builds_nothing():
    rows = [make_row(prompt=[1], output=[1, 1], temperature=0.3, top_k=3)]
    assert PenaltyTensors.build(rows, VOCAB, CPU) is None


def test_repetition_penalty_reaches_prompt_tokens_but_frequency_does_not():
    logits = torch.tensor([[2.0, -2.0, 2.0, 2.0] + [0.0] * (VOCAB - 4)])
    rep = _penalised([make_row(prompt=[0, 1], output=[], repetition_penalty=2.0)], logits)
    assert rep[0, :4].tolist() == [1.0, -4.0, 2.0, 2.0]
    freq = _penalised([make_row(prompt=[0, 1], output=[2, 2], frequency_penalty=0.5)], logits)
    assert freq[0, :4].tolist() == [2.0, -2.0, 1.0, 2.0]


def test_repetition_penalty_stops_greedy_repeating():
    logits = torch.tensor([[3.0, 2.0] + [0.0] * (VOCAB - 2)])
    row = make_row(prompt=[5], output=[0], temperature=0.0, repetition_penalty=2.0)
    assert sample([row], logits).sampled_token_ids.item() == 1
