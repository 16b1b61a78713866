"""The n-gram proposer's incremental index gives lookup_ngram's drafts (the rule written as one
numpy scan) at every step of growing sequences, for every n range, and forgets finished
requests."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from folio.config.speculative import SpeculativeConfig
from folio.spec_decode.ngram import NgramIndex, NgramProposer, lookup_ngram
from folio.spec_decode.proposer import ProposalBatch


@pytest.mark.parametrize(("n_min", "n_max"), [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_index_answers_like_the_scan_as_tokens_arrive(n_min, n_max):
    rng = random.Random(n_min * 10 + n_max)
    for _ in range(20):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]  # few ids: many repeats
        index = NgramIndex(n_min, n_max)
        index.extend(tokens)
        for _ in range(30):
            assert index.lookup(3) == lookup_ngram(np.asarray(tokens), n_min, n_max, 3)
            new = [rng.randrange(4) for _ in range(rng.choice([1, 1, 2, 5]))]
            tokens += new
            index.extend(new)


def _batch(requests, emitted):
    scheduled = [SimpleNamespace(request_id=rid, request=SimpleNamespace(all_token_ids=toks, can_speculate=True))
                 for rid, toks in requests]
    return ProposalBatch(scheduled, None, None, dict(enumerate(emitted)))


def test_proposer_follows_each_request_and_forgets_finished_ones():
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=2)
    proposer = NgramProposer(config)
    a, b = [1, 2, 3, 1, 2], [7, 8, 9]
    assert proposer.propose(_batch([("a", a), ("b", b)], [[3], [7]])) == {0: [1, 2], 1: [8, 9]}
    a, b = a + [3], b + [7]  # the scheduler appended the emitted tokens
    assert proposer.propose(_batch([("a", a), ("b", b)], [[1, 9], [5]])) == {
        0: lookup_ngram(np.asarray(a + [1, 9]), 1, 2, 2), 1: []}
    proposer.forget(["a"])
    assert set(proposer.indices) == {"b"}
    # A different sequence under a known id (never happens in the engine) is indexed afresh.
    assert proposer.propose(_batch([("b", [4, 4])], [[4]])) == {0: [4]} == {0: lookup_ngram(np.asarray([4, 4, 4]), 1, 2, 2)}
