"""SpecVerifier: each scored position is processed as the sampler would process it (temperature,
top-k, penalties counting the drafts before it), and the emitted tokens follow that distribution."""

from __future__ import annotations

import torch

from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest
from folio.sampling_params import SamplingParams
from folio.spec_decode.verifier import SpecVerifier

VOCAB = 6
N = 12_000


def _sched(i: int, params: SamplingParams, drafts: tuple[int, ...]) -> ScheduledRequest:
    request = Request(f"r{i}", [0, 1], params)
    request.append_output_token_ids([3])
    # Verify step: the last token (index 2) plus the drafts.
    return ScheduledRequest(request, 2, 1 + len(drafts), [0], True, drafts)


def _chi2_pvalue(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=VOCAB).double()
    expected = probs.double() * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing drawn where the target has no mass
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, statistic / 2))


def test_first_token_follows_the_processed_target_distribution():
    logits_row = torch.tensor([2.0, 1.5, 0.2, 1.0, -1.0, 0.5])
    params = SamplingParams(temperature=0.7, top_k=4, max_tokens=10)
    scheds = [_sched(i, params, (1, 0)) for i in range(N)]
    logits = logits_row.repeat(N * 3, 1)  # [rows, vocab]
    verified = SpecVerifier(VOCAB, seed=0, device=torch.device("cpu")).verify(logits, scheds, lambda s: None)
    scaled = logits_row / 0.7
    scaled[scaled < scaled.topk(4).values[-1]] = float("-inf")
    p = scaled.softmax(-1)
    first = [tokens[0] for tokens in verified.token_ids]
    assert _chi2_pvalue(first, p) > 1e-3
    accepted = [len(t) - 1 for t in verified.token_ids]
    assert 0 < sum(a >= 1 for a in accepted) < N  # draft 1 (p = 0.2-ish) accepted sometimes


def test_penalties_count_the_drafts_before_each_position():
    """Greedy with a huge presence penalty: token 0 is the argmax, but at the row after the
    draft 0 it has been 'generated' and must lose to token 1; a draft 1 there is then accepted."""
    logits = torch.tensor([[5.0, 4.0, 0, 0, 0, 0]]).repeat(3, 1)
    params = SamplingParams(temperature=0, presence_penalty=2.0, max_tokens=10)
    verified = SpecVerifier(VOCAB, seed=0, device=torch.device("cpu")).verify(logits, [_sched(0, params, (0, 1))], lambda s: None)
    # Row 0: 0 (outputs [3]); row 1: outputs [3, 0] -> 0 is penalised to 3 < 4 -> 1; row 2:
    # outputs [3, 0, 1] -> 0 (3.0) and 1 (2.0) both penalised -> 0.
    assert verified.token_ids == [[0, 1, 0]]


def test_seeded_requests_repeat_whatever_the_batch():
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=10)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    verifier = SpecVerifier(VOCAB, seed=0, device=torch.device("cpu"))

    def run(batch_size: int) -> list[int]:
        scheds = [_sched(i, params, (2, 3)) for i in range(batch_size)]
        generators = {id(s): torch.Generator().manual_seed(5) for s in scheds}
        out = verifier.verify(logits.repeat(batch_size, 1), scheds, lambda s: generators[id(s)])
        return out.token_ids[0]

    assert run(1) == run(4)


def test_all_greedy_batch_matches_the_rejection_sampler():
    """An all-greedy batch is verified on the host from the argmax alone: the same tokens as
    rejection.py's batched greedy rule, for drafts of every length and every mismatch point."""
    from folio.spec_decode.rejection import rejection_sample

    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0, max_tokens=10)
    scheds, rows = [], []
    for i in range(40):
        k = i % 5
        logits = torch.randn(k + 1, VOCAB, generator=gen)
        argmax = logits.argmax(-1).tolist()
        # Drafts that follow the argmax up to a point (each one in turn), then differ.
        cut = (i // 5) % (k + 1)
        drafts = tuple(argmax[j] if j < cut else (argmax[j] + 1) % VOCAB for j in range(k))
        scheds.append(_sched(i, params, drafts))
        rows.append(logits)
    logits = torch.cat(rows)
    verified = SpecVerifier(VOCAB, seed=0, device=torch.device("cpu")).verify(logits, scheds, lambda s: None)
    num_drafts = torch.tensor([len(s.spec_token_ids) for s in scheds])
    draft_ids = torch.tensor([t for s in scheds for t in (*s.spec_token_ids, 0)])
    tokens, accepted = rejection_sample(None, logits.argmax(-1), draft_ids, num_drafts, torch.ones(40, dtype=torch.bool))
    expected = [row[: n + 1] for row, n in zip(tokens.tolist(), accepted.tolist())]
    assert verified.token_ids == expected
    assert {len(t) for t in expected} == {1, 2, 3, 4, 5}
