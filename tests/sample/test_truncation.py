"""min_p, top-k and top-p keep exactly the tokens a direct computation keeps."""

from __future__ import annotations

import math
import random

import pytest
import torch

from folio.sample.truncation import apply_min_p, apply_top_k_top_p
from tests.sample.rows import make_row, sample

VOCAB = 10


def _softmax(values: dict[int, float]) -> dict[int, float]:
    top = max(values.values())
    exps = {t: math.exp(v - top) for t, v in values.items()}
    total = sum(exps.values())
    return {t: e / total for t, e in exps.items()}


def _expected_kept(row: list[float], k: int, p: float, min_p: float) -> set[int]:
    """min_p, then top-k (ties with the k-th kept), then the smallest top set reaching p."""
    kept = {t: v for t, v in enumerate(row)}
    if min_p > 0:
        probs = _softmax(kept)
        kept = {t: kept[t] for t in kept if probs[t] >= min_p * max(probs.values())}
    if 0 < k < len(row):
        kth = sorted(kept.values(), reverse=True)[k - 1] if k <= len(kept) else -math.inf
        kept = {t: v for t, v in kept.items() if v >= kth}
    if p < 1.0:
        probs = _softmax(kept)
        mass_before, chosen = 0.0, {}
        for t in sorted(kept, key=lambda t: -probs[t]):
            if mass_before >= p:
                break
            # The test's logits avoid the knife edge where float32 rounding could decide.
            assert abs(mass_before - p) > 1e-4 or mass_before == 0.0
            chosen[t] = kept[t]
            mass_before += probs[t]
        kept = chosen
    return set(kept)


def _apply(logits: torch.Tensor, ks: list[int], ps: list[float], min_ps: list[float]):
    out = logits.clone()
    if any(m > 0 for m in min_ps):
        apply_min_p(out, torch.tensor(min_ps))
    k = [v if 0 < v < VOCAB else VOCAB for v in ks]
    top_k = torch.tensor(k) if any(v < VOCAB for v in k) else None
    top_p = torch.tensor(ps) if any(v < 1.0 for v in ps) else None
    max_k = max((v for v in k if v < VOCAB), default=0)
    apply_top_k_top_p(out, top_k, top_p, max_k)
    return out


def _kept(row: torch.Tensor) -> set[int]:
    return {t for t in range(row.numel()) if row[t].item() != -math.inf}


@pytest.mark.parametrize("seed", range(8))
def test_mixed_batch_keeps_the_expected_sets(seed):
    rng = random.Random(seed)
    rows = 6
    ks = [rng.choice([0, 1, 3, 5, VOCAB, VOCAB + 4]) for _ in range(rows)]
    ps = [rng.choice([1.0, 0.3, 0.55, 0.8, 0.95]) for _ in range(rows)]
    min_ps = [rng.choice([0.0, 0.0, 0.05, 0.2]) for _ in range(rows)]
    # Well separated logits (steps of 0.37 + noise): no ties, no knife edges.
    logits = torch.tensor(
        [
            [rng.uniform(-0.1, 0.1) + 0.37 * rng.randrange(20) for _ in range(VOCAB)]
            for _ in range(rows)
        ]
    )
    out = _apply(logits, ks, ps, min_ps)
    for r in range(rows):
        assert _kept(out[r]) == _expected_kept(logits[r].tolist(), ks[r], ps[r], min_ps[r]), r
        kept = list(_kept(out[r]))
        assert torch.equal(out[r, kept], logits[r, kept])  # survivors are not changed


def test_top_k_keeps_ties_with_the_kth_logit():
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert _kept(_apply(logits, [2], [1.0], [0.0])[0]) == {0, 1, 2}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = [0.5, 0.3, 0.1, 0.05, 0.05]
    logits = torch.log(torch.tensor([probs + [1e-9] * (VOCAB - 5)]))
    assert _kept(_apply(logits, [0], [0.5], [0.0])[0]) == {0}  # 0.5 reaches 0.5
    assert _kept(_apply(logits, [0], [0.51], [0.0])[0]) == {0, 1}
    assert _kept(_apply(logits, [0], [0.85], [0.0])[0]) == {0, 1, 2}
    assert _kept(_apply(logits, [0], [0.01], [0.0])[0]) == {0}  # never empty


def test_top_k_without_sort_equals_the_sorting_path():
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1))
    top_k = torch.tensor([1, 4, VOCAB, 7, 2])
    quick, sorted_path = logits.clone(), logits.clone()
    apply_top_k_top_p(quick, top_k, None, 7)
    apply_top_k_top_p(sorted_path, top_k, torch.ones(5), 7)  # top_p of 1 forces the sort
    assert torch.equal(quick, sorted_path)
    assert [len(_kept(r)) for r in quick] == [1, 4, VOCAB, 7, 2]


def test_sampling_draws_exactly_the_kept_set():
    """Through the whole sampler: many draws (one row each) hit every kept token, nothing else."""
    logits = torch.tensor([[2.0, 1.6, 1.5, 1.2, 0.5, 0.4, 0.0, -1.0, -2.0, -3.0]])
    draws = 3000
    cases = [
        (dict(top_k=4), {0, 1, 2, 3}),
        (dict(top_p=0.6), _expected_kept(logits[0].tolist(), 0, 0.6, 0.0)),
        (dict(min_p=0.3), _expected_kept(logits[0].tolist(), 0, 1.0, 0.3)),
        (dict(top_k=5, top_p=0.8, temperature=0.7), None),
    ]
    for fields, expected in cases:
        if expected is None:  # temperature sharpens the distribution before top-p
            expected = _expected_kept((logits[0] / 0.7).tolist(), 5, 0.8, 0.0)
        rows = [make_row(**fields)] * draws
        seen = set(sample(rows, logits.expand(draws, -1)).sampled_token_ids.tolist())
        assert seen == expected, fields


def test_tiny_top_p_still_keeps_the_top_token():
    # 1 - 1e-9 rounds to 1 in float32, and the mass of a near-certain top token sums to
    # exactly 1: without a guard every token would be dropped.
    logits = torch.tensor([[0.0, 100.0] + [1.0] * (VOCAB - 2)])
    assert _kept(_apply(logits, [0], [1e-9], [0.0])[0]) == {1}


def test_rows_without_truncation_come_out_unchanged_in_a_sorting_batch():
    # Row 0's token 2 has probability 0 in float32 (exp(-200)); top_p = 1 must still keep it,
    # so a row's logits never depend on whether another row forced the sort.
    logits = torch.tensor([[0.0, 1.0, -200.0] + [0.5] * (VOCAB - 3)] * 2)
    out = _apply(logits, [0, 0], [1.0, 0.5], [0.0, 0.0])
    assert torch.equal(out[0], logits[0])
