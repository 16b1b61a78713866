"""The Sampler end to end: greedy, seeds, batch independence, the drawn distribution."""

from __future__ import annotations

import math
import random

import pytest
import torch

from folio.sample import Sampler
from folio.sample import SamplingMetadata
from tests.sample.rows import CPU, decode_seeded, make_row, sample, step_logits

VOCAB = 40


def _logits(rows: int, seed: int) -> torch.Tensor:
    return step_logits(rows, VOCAB, seed)


def test_greedy_equals_argmax():
    logits = _logits(7, 0)
    out = sample([make_row(temperature=0.0)] * 7, logits)
    assert torch.equal(out.sampled_token_ids, logits.argmax(dim=-1))
    assert out.sampled_token_ids.dtype == torch.int64
    assert out.logprobs is None and out.logprob_token_ids is None and out.sampled_ranks is None


def test_greedy_rows_in_a_mixed_batch_take_the_argmax():
    logits = _logits(6, 1)
    rows = [make_row(temperature=0.0 if r % 2 else 1.5, top_p=0.9) for r in range(6)]
    out = sample(rows, logits).sampled_token_ids
    assert torch.equal(out[1::2], logits[1::2].argmax(dim=-1))


def test_input_logits_are_left_unchanged():
    logits = _logits(3, 2)
    before = logits.clone()
    rows = [
        make_row(temperature=0.5, top_k=3, logit_bias={1: 5.0}),
        make_row(temperature=0.0, repetition_penalty=1.3, prompt=[1, 2]),
        make_row(min_p=0.1, allowed_token_ids=[1, 2, 3]),
    ]
    sample(rows, logits)
    assert torch.equal(logits, before)


# ---- seeds ------------------------------------------------------------------------------------

SEEDED = [
    dict(temperature=0.9, top_k=8, seed=1234),  # top-k alone: the no-sort path when alone
    dict(temperature=1.0, min_p=0.02, repetition_penalty=1.2, seed=-7),
    dict(temperature=0.7, top_p=0.9, frequency_penalty=0.5, seed=2**40),
]
OTHERS = [
    dict(temperature=0.0),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.6, seed=99),
    dict(temperature=1.0, presence_penalty=1.0, logit_bias={3: 2.0}),
    dict(temperature=0.8, min_p=0.1, top_k=3, allowed_token_ids=list(range(20))),
]


@pytest.mark.parametrize("fields", SEEDED)
def test_seeded_row_ignores_the_rest_of_the_batch(fields):
    steps = 12
    alone = decode_seeded(fields, steps, lambda step: [], sampler_seed=0, vocab=VOCAB)
    rng = random.Random(5)

    def crowd(step: int) -> list:
        chosen = rng.sample(OTHERS, rng.randint(1, len(OTHERS)))
        return [make_row(**f, prompt=[4], output=[step % VOCAB]) for f in chosen]

    crowded = decode_seeded(fields, steps, crowd, sampler_seed=321, vocab=VOCAB)
    assert crowded == alone
    assert len(set(alone)) > 1  # the draw is random, not a constant
    reseeded = {**fields, "seed": fields["seed"] + 1}
    other_seed = decode_seeded(reseeded, steps, lambda step: [], sampler_seed=0, vocab=VOCAB)
    assert other_seed != alone


def test_unseeded_sampling_repeats_with_the_same_sampler_seed():
    logits = _logits(8, 3)
    rows = [make_row(temperature=1.0, top_p=0.95) for _ in range(8)]
    runs = []
    for sampler_seed in (11, 11, 12):
        sampler = Sampler(sampler_seed, CPU)
        runs.append([sample(rows, logits, sampler).sampled_token_ids.tolist() for _ in range(3)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def _chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs))


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_draws_follow_softmax_of_logits_over_temperature(temperature, seeded):
    base = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    expected = torch.softmax(base.double() / temperature, dim=0).tolist()
    draws = 4000
    rows = [
        make_row(temperature=temperature, seed=i if seeded else None) for i in range(draws)
    ]
    tokens = sample(rows, base.expand(draws, -1)).sampled_token_ids.tolist()
    counts = [tokens.count(t) for t in range(5)]
    # 4 degrees of freedom: P(chi2 > 25) < 1e-4, while a wrong temperature (0.5 vs 1, say)
    # gives hundreds.
    assert _chi_square(counts, expected) < 25.0, counts
    if temperature != 1.0:
        plain = torch.softmax(base.double(), dim=0).tolist()
        assert _chi_square(counts, plain) > 100.0


def test_zero_probability_tokens_are_never_drawn():
    logits = torch.full((2000, VOCAB), -math.inf)
    logits[:, 5] = 0.0
    logits[:, 9] = -40.0  # probability ~4e-18: never in 2000 draws
    out = sample([make_row(temperature=1.0)] * 2000, logits).sampled_token_ids
    assert set(out.tolist()) == {5}


# ---- 16-bit logits (the LM head's dtype, session 21) -----------------------------------------

MIXED = [
    dict(temperature=0.0),
    dict(temperature=0.0, logprobs=3),
    dict(temperature=0.9, top_k=8, seed=1234),
    dict(temperature=1.0, min_p=0.02, repetition_penalty=1.2, seed=-7),
    dict(temperature=0.7, top_p=0.9, seed=5),
    dict(temperature=0.6, seed=99, logprobs=2),
    dict(temperature=1.0, presence_penalty=1.0, logit_bias={3: 2.0}, seed=3),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("batch", ["greedy", "mixed", "random"])
def test_16bit_logits_sample_as_their_float32_widening(dtype, fused, batch):
    """The runner hands the sampler the LM head's own dtype; every path must give what it gives
    on the exactly widened float32 logits: tokens, log-probs and ranks, and the input untouched."""
    rows_of = {"greedy": [dict(temperature=0.0)] * 3, "mixed": MIXED, "random": MIXED[2:3] + MIXED[4:5]}[batch]
    low = (_logits(len(rows_of), 9) * 4).to(dtype)
    low[0, 5] = low[0].max()  # a tie: the first index wins in both dtypes
    before = low.clone()

    def run(logits):
        rows = [make_row(prompt=[1, 2], output=[3], **fields) for fields in rows_of]  # fresh generators
        return sample(rows, logits, Sampler(7, CPU, fused=fused))

    got, want = run(low), run(low.float())
    assert torch.equal(low, before)
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
    for name in ("logprob_token_ids", "logprobs", "sampled_ranks"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name


@pytest.mark.parametrize("owned", [False, True])
def test_truncation_widens_16bit_logits_before_any_arithmetic(owned):
    """Temperature, min_p, top-k and top-p run on float32: on bf16 logits they give exactly what
    they give on the widened logits (bf16 arithmetic would round the tempered values)."""
    low = (_logits(4, 11) * 3).to(torch.bfloat16)
    rows = [make_row(temperature=t, min_p=0.05, top_k=9, top_p=0.8) for t in (0.3, 0.7, 1.1, 1.7)]
    metadata = SamplingMetadata.build(rows, VOCAB, CPU)
    sampler = Sampler(0, CPU)
    got = sampler._truncated(low.clone() if owned else low, metadata, metadata.temperature, owned)
    want = sampler._truncated(low.float(), metadata, metadata.temperature, True)
    assert got.dtype == torch.float32 and torch.equal(got, want)
