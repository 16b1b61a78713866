"""allowed_token_ids, min_tokens and logit_bias: the masks themselves, then through the sampler."""

from __future__ import annotations

import math

import torch

from folio.sample.constraints import TokenConstraints
from folio.sampling_params import SamplingParams
from tests.sample.rows import CPU, make_row, sample

VOCAB = 8
EOS = 3


def _constrained(rows, logits: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    constraints = TokenConstraints.build(rows, VOCAB, CPU)
    if constraints is not None:
        constraints.apply(out)
    return out


def _logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(7))


def test_no_constraint_builds_nothing():
    rows = [make_row(temperature=0.5, top_p=0.9), make_row(min_tokens=0, stop_token_ids=[1])]
    assert TokenConstraints.build(rows, VOCAB, CPU) is None


def test_allowed_token_ids_keeps_exactly_the_whitelist():
    rows = [make_row(allowed_token_ids=[1, 4, 6]), make_row(), make_row(allowed_token_ids=[0])]
    logits = _logits(3)
    out = _constrained(rows, logits)
    for r, allowed in ((0, {1, 4, 6}), (1, set(range(VOCAB))), (2, {0})):
        for t in range(VOCAB):
            expected = logits[r, t].item() if t in allowed else -math.inf
            assert out[r, t].item() == expected, (r, t)


def test_allowed_token_ids_only_ever_sampled():
    logits = torch.zeros(500, VOCAB)
    logits[:, 0] = 5.0  # the most likely token is not allowed
    rows = [make_row(allowed_token_ids=[2, 5])] * 500
    seen = set(sample(rows, logits).sampled_token_ids.tolist())
    assert seen == {2, 5}


def _min_tokens_params(**kw) -> SamplingParams:
    params = SamplingParams(min_tokens=2, stop_token_ids=[5], **kw)
    params.update_from_model({EOS})
    return params


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    params = _min_tokens_params()
    rows = [
        make_row(params, output=[]),
        make_row(params, output=[1]),
        make_row(params, output=[1, 2]),  # min_tokens reached: nothing masked
        make_row(output=[]),  # no min_tokens
    ]
    logits = _logits(4)
    out = _constrained(rows, logits)
    for r in range(4):
        for t in range(VOCAB):
            banned = r < 2 and t in (EOS, 5)
            assert out[r, t].item() == (-math.inf if banned else logits[r, t].item()), (r, t)


def test_min_tokens_with_ignore_eos_bans_only_stop_token_ids():
    rows = [make_row(_min_tokens_params(ignore_eos=True))]
    out = _constrained(rows, _logits(1))
    assert out[0, 5].item() == -math.inf
    assert out[0, EOS].item() != -math.inf


def test_min_tokens_greedy_skips_eos_until_reached():
    params = _min_tokens_params(temperature=0.0)
    logits = torch.tensor([[0.0, 1.0, 0.5, 9.0, 0.0, 8.0, 0.0, 0.0]])  # EOS best, stop id next
    tokens = [
        sample([make_row(params, output=[0] * n)], logits).sampled_token_ids.item()
        for n in range(4)
    ]
    assert tokens == [1, 1, EOS, EOS]


def test_logit_bias_adds_to_the_named_tokens():
    rows = [make_row(logit_bias={2: 1.5, 7: -100.0}), make_row(), make_row(logit_bias={0: 3.0})]
    logits = _logits(3)
    out = _constrained(rows, logits)
    expected = logits.clone()
    expected[0, 2] += 1.5
    expected[0, 7] += -100.0
    expected[2, 0] += 3.0
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_logit_bias_moves_the_greedy_token():
    logits = torch.tensor([[2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    plain = sample([make_row(temperature=0.0)], logits).sampled_token_ids.item()
    biased = sample([make_row(temperature=0.0, logit_bias={4: 2.5})], logits)
    assert (plain, biased.sampled_token_ids.item()) == (0, 4)


def test_bias_cannot_revive_a_banned_token():
    params = _min_tokens_params(logit_bias={EOS: 100.0}, allowed_token_ids=[1, 2, 5, EOS])
    out = _constrained([make_row(params)], _logits(1))
    assert out[0, EOS].item() == -math.inf and out[0, 0].item() == -math.inf
    assert math.isfinite(out[0, 1].item())
