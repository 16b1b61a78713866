"""The rejection sampler keeps the target's distribution: chi-square tests on a tiny vocabulary,
with a biased accept rule that the same test must catch, and greedy acceptance by hand."""

from __future__ import annotations

import pytest
import torch

from folio.spec_decode import rejection
from folio.spec_decode.rejection import rejection_sample

VOCAB = 6
N = 60_000  # requests per test; each has K drafts
K = 2
ALPHA = 1e-3


def _dist(*values: float) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


# Target rows p_0 (after the known tokens) and p_1 (after draft 1), and a draft q far from them.
P = torch.stack([_dist(5, 1, 1, 2, 0.5, 0.5), _dist(1, 3, 0.2, 0.8, 2, 3), _dist(1, 1, 1, 1, 1, 5)])
Q = torch.stack([_dist(1, 4, 2, 1, 1, 1), _dist(3, 1, 1, 1, 0.5, 0.5), _dist(1, 1, 1, 1, 1, 1)])


def _run(point_mass: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = N * (K + 1)
    target = P.repeat(N, 1)  # [rows, vocab]
    if point_mass:
        draft_probs = None
        drafts = torch.tensor([0, 4, 0]).repeat(N)  # the same fixed guesses for every request
    else:
        draft_probs = Q.repeat(N, 1)  # [rows, vocab]
        drafts = torch.multinomial(draft_probs, 1, generator=g).squeeze(1)  # d_j ~ q_{j-1}
    uniforms = torch.rand(rows, generator=g)
    noise = torch.empty(rows, VOCAB).exponential_(generator=g)
    num_drafts = torch.full((N,), K)
    greedy = torch.zeros(N, dtype=torch.bool)
    return rejection_sample(target, target.argmax(-1), drafts, num_drafts, greedy, uniforms, noise, draft_probs)


def _pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of the counts against probs (every prob > 0 here)."""
    counts = torch.bincount(samples, minlength=VOCAB).double()
    expected = probs.double() * counts.sum()
    statistic = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor((VOCAB - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, statistic / 2))  # survival function of chi2(df)


def _check(tokens: torch.Tensor, num_accepted: torch.Tensor) -> tuple[float, float, float]:
    """p-values: the first token against p_0, the second (after an accepted draft) against
    p_1, the third (both accepted: the bonus) against p_2."""
    first = _pvalue(tokens[:, 0], P[0])
    second = _pvalue(tokens[num_accepted >= 1, 1], P[1])
    third = _pvalue(tokens[num_accepted >= 2, 2], P[2])
    return first, second, third


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-probs", "point-mass"])
def test_emitted_tokens_follow_the_target(point_mass):
    tokens, num_accepted = _run(point_mass)
    assert (num_accepted >= 1).sum() > N // 10 and (num_accepted == 0).sum() > N // 10  # both paths taken
    assert min(_check(tokens, num_accepted)) > ALPHA
    # Shape contract: exactly num_accepted + 1 tokens, then -1.
    lengths = (tokens >= 0).sum(1)
    assert torch.equal(lengths, num_accepted + 1)


def test_a_biased_accept_rule_is_caught(monkeypatch):
    """Accepting with probability p(d), ignoring q, is the classic bug: the test must see it."""

    def biased(p, draft_ids, uniforms, noise, q):
        index = draft_ids.unsqueeze(1)
        accept = uniforms < p.gather(1, index).squeeze(1)
        return accept, rejection._race((p - q).clamp_min(0.0), noise)

    monkeypatch.setattr(rejection, "_accept_and_recover", biased)
    tokens, num_accepted = _run(point_mass=False)
    assert _check(tokens, num_accepted)[0] < 1e-6


def test_seeded_noise_repeats():
    a, b = _run(False, seed=3), _run(False, seed=3)
    assert torch.equal(a[0], b[0])


def test_greedy_is_longest_matching_prefix_plus_the_target_token():
    # Two greedy requests: 3 drafts (first two match), 1 draft (matches: bonus follows).
    logits = torch.full((6, VOCAB), -5.0)
    argmax = [2, 3, 1, 5, 4, 0]
    logits[range(6), argmax] = 5.0
    drafts = torch.tensor([2, 3, 4, 0, 4, 0])  # request 0 rows 0-3, request 1 rows 4-5
    tokens, num_accepted = rejection_sample(
        None, logits.argmax(-1), drafts, torch.tensor([3, 1]), torch.tensor([True, True])
    )
    assert num_accepted.tolist() == [2, 1]
    assert tokens.tolist() == [[2, 3, 1, -1], [4, 0, -1, -1]]


def test_no_drafts_samples_the_target():
    """k = 0 for every request: each emits one token drawn from its row (the bonus)."""
    g = torch.Generator().manual_seed(1)
    target = P[0].repeat(N, 1)
    noise = torch.empty(N, VOCAB).exponential_(generator=g)
    tokens, num_accepted = rejection_sample(
        target, target.argmax(-1), torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long),
        torch.zeros(N, dtype=torch.bool), torch.rand(N, generator=g), noise,
    )
    assert tokens.shape == (N, 1) and not num_accepted.any()
    assert _pvalue(tokens[:, 0], P[0]) > ALPHA
