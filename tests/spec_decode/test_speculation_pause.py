"""Speculator._pause_for: drafting pauses while the next verify step would outgrow the largest
decode graph. The estimate counts 1 + k tokens only for requests that may draft (a request with
a grammar, say, verifies nothing: one token), and a step in which no request sampled (prompt
chunks only) says nothing about the next verify step: it leaves the pause as it was, unlogged."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from folio.spec_decode.speculator import Speculator


def _speculator(k: int, max_graph_tokens: int) -> Speculator:
    speculator = Speculator.__new__(Speculator)  # no model: only the pause's state
    speculator.proposer = SimpleNamespace(k=k, kv_bytes_per_block=0)
    speculator.disable_by_batch_size = None
    speculator.max_graph_tokens = max_graph_tokens
    speculator._paused = False
    return speculator


def test_requests_that_cannot_draft_count_one_token():
    speculator = _speculator(k=4, max_graph_tokens=16)
    # 10 requests of which 1 may draft: the next step verifies 9 + 5 = 14 tokens, a graph holds it.
    assert not speculator._pause_for(10, num_drafting=1)
    assert speculator._pause_for(10, num_drafting=2)  # 8 + 10 = 18 tokens
    assert speculator._pause_for(4)  # all of them draft: 4 x 5 = 20 tokens


def test_steps_where_nothing_sampled_leave_the_pause_alone(caplog):
    speculator = _speculator(k=4, max_graph_tokens=16)
    with caplog.at_level(logging.INFO, logger="folio.spec_decode.speculator"):
        assert speculator._pause_for(4)
        assert speculator._pause_for(0) and speculator._paused  # a prompt-only step
        assert speculator._pause_for(4)
    assert caplog.text.count("paused") == 1 and "resumed" not in caplog.text
