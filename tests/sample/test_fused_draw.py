"""The Sampler's fused draw (temperature + Gumbel-max in one Triton kernel), through Triton's
interpreter on the CPU (on the GPU where there is one): seeds independent of the batch, the drawn
distribution, masked tokens."""

from __future__ import annotations

import math

import pytest
import torch

from folio.sample import Sampler, SamplingMetadata
from tests.sample.rows import make_row as _make_row
from tests.sample.rows import step_logits as _step_logits

pytest.importorskip("triton")
VOCAB = 300
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: Triton's interpreter
CPU = DEV  # the Sampler's device below


def make_row(**fields):
    return _make_row(device=DEV, **fields)


def step_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return _step_logits(rows, vocab, seed, DEV)


def _step(sampler: Sampler, rows: list, logits: torch.Tensor) -> torch.Tensor:
    return sampler(logits, SamplingMetadata.build(rows, logits.shape[-1], logits.device)).sampled_token_ids


@pytest.mark.parametrize("fields", [dict(temperature=0.6, seed=5), dict(temperature=0.9, top_k=30, top_p=0.9, seed=2**40)])
def test_seeded_row_ignores_the_rest_of_the_batch(fields):
    seeded = make_row(**fields)
    alone, crowded = [], []
    sampler_a, sampler_b = Sampler(0, CPU, fused=True), Sampler(99, CPU, fused=True)
    again = make_row(**fields)
    for step in range(6):
        logits = step_logits(1, VOCAB, step)
        alone.append(int(_step(sampler_a, [seeded], logits)[0]))
        others = [make_row(temperature=1.2), make_row(temperature=0.0), make_row(temperature=0.7, seed=3)]
        batch = others[: step % 3] + [again] + others[step % 3 :]
        crowd_logits = torch.cat([step_logits(len(batch), VOCAB, 100 + step)])
        crowd_logits[step % 3] = logits[0]
        crowded.append(int(_step(sampler_b, batch, crowd_logits)[step % 3]))
    assert alone == crowded
    assert len(set(alone)) > 1


def test_draws_follow_softmax_of_logits_over_temperature():
    # 200 draws (the interpreter runs one program per row): enough to tell T from 1/T or from 1.
    temperature, draws = 0.6, 200
    logits = torch.tensor([[0.0, 0.5, 1.0, -1.0]], device=DEV).expand(draws, 4).contiguous()
    rows = [make_row(temperature=temperature) for _ in range(draws)]
    sampled = _step(Sampler(1, CPU, fused=True), rows, logits)
    counts = torch.bincount(sampled, minlength=4).double().cpu()
    expected = torch.softmax(logits[0].double().cpu() / temperature, dim=-1) * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 21, (chi2, counts, expected)  # 3 degrees of freedom: p < 1e-4 for a fair draw
    wrong = torch.softmax(logits[0].double().cpu() * temperature, dim=-1) * draws  # T applied upside down
    assert float(((counts - wrong) ** 2 / wrong).sum()) > chi2
    assert not math.isnan(chi2)


def test_masked_tokens_are_never_drawn_and_greedy_rows_take_the_argmax():
    logits = step_logits(8, VOCAB, 2)
    rows = [make_row(temperature=1.5, allowed_token_ids=[3, 7, 11]) for _ in range(6)]
    rows += [make_row(temperature=0.0), make_row(temperature=2.0, top_k=2)]
    sampled = _step(Sampler(3, CPU, fused=True), rows, logits)
    assert set(sampled[:6].tolist()) <= {3, 7, 11}
    assert sampled[6] == logits[6].argmax()
    assert sampled[7] in logits[7].topk(2).indices


def test_input_logits_are_left_unchanged():
    logits = step_logits(3, VOCAB, 6)
    before = logits.clone()
    rows = [make_row(temperature=0.5), make_row(temperature=0.7, top_p=0.8), make_row(min_p=0.1)]
    _step(Sampler(0, CPU, fused=True), rows, logits)
    assert torch.equal(logits, before)


def test_unseeded_draws_repeat_with_the_same_sampler_seed():
    logits = step_logits(16, VOCAB, 8)
    rows = [make_row(temperature=1.0) for _ in range(16)]
    first, same, other = (_step(Sampler(s, CPU, fused=True), rows, logits) for s in (11, 11, 12))
    assert torch.equal(first, same) and not torch.equal(first, other)
