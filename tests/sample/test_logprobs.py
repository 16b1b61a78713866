"""Log-probs: raw log_softmax values, the sampled token first, top-k best first, 1-based ranks."""

from __future__ import annotations

import math

import torch

from folio.sample import gather_logprobs
from tests.sample.rows import make_row, sample

VOCAB = 16


def _log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    log_total = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - log_total for v in row]


def _rank(row: list[float], token: int) -> int:
    return 1 + sum(1 for v in row if v > row[token])


def test_sampled_logprobs_are_of_the_raw_logits():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    rows = [
        make_row(logprobs=3, temperature=0.3, top_k=4, repetition_penalty=1.5, prompt=[0, 1, 2]),
        make_row(logprobs=0, temperature=0.0, logit_bias={5: 50.0}),  # forces token 5
        make_row(temperature=1.0),  # asked for nothing: padded to the batch's width anyway
        make_row(logprobs=5, temperature=1.0, min_p=0.2),
    ]
    out = sample(rows, logits)
    sampled = out.sampled_token_ids.tolist()
    assert sampled[1] == 5
    assert out.logprob_token_ids.shape == (4, 6) and out.logprobs.shape == (4, 6)
    assert out.logprob_token_ids.dtype == torch.int64 and out.logprobs.dtype == torch.float32
    for r in range(4):
        raw = _log_softmax(logits[r].tolist())
        ids, values = out.logprob_token_ids[r].tolist(), out.logprobs[r].tolist()
        assert ids[0] == sampled[r]
        best_first = sorted(range(VOCAB), key=lambda t: -raw[t])[:5]
        assert ids[1:] == best_first
        for t, v in zip(ids, values):
            assert abs(v - raw[t]) < 1e-5
        assert out.sampled_ranks[r].item() == _rank(raw, sampled[r])


def test_ranks_count_strictly_better_tokens():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0], [5.0, 5.0, 0.0, -1.0]])
    ids, values, ranks = gather_logprobs(logits, torch.tensor([3, 1]), 2)
    assert ranks.tolist() == [4, 1]  # a token tied with the best has rank 1
    assert ids[:, 0].tolist() == [3, 1]
    assert ids[0, 1].item() == 0


def test_prompt_logprobs_with_zero_top_k_give_only_the_chosen_token():
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 3, 15, 7, 7])
    ids, values, ranks = gather_logprobs(logits, targets, 0)
    assert ids.shape == (5, 1) and values.shape == (5, 1) and ranks.shape == (5,)
    for r in range(5):
        raw = _log_softmax(logits[r].tolist())
        t = targets[r].item()
        assert ids[r, 0].item() == t
        assert abs(values[r, 0].item() - raw[t]) < 1e-5
        assert ranks[r].item() == _rank(raw, t)


def test_top_k_larger_than_the_vocabulary_is_cut_to_it():
    ids, values, _ = gather_logprobs(torch.zeros(1, 3), torch.tensor([1]), 10)
    assert ids.shape == (1, 4)
    assert sorted(ids[0, 1:].tolist()) == [0, 1, 2]
