"""Workloads: W1 exactly as DESIGN.md defines it, random lengths within their bounds, subsets."""

from __future__ import annotations

import random

import pytest

from folio.benchmarks.workloads import make_workload, random_workload, w1


def test_w1_matches_design():
    w = w1()
    assert w.num_requests == 256
    assert w.output_tokens == 133_966
    assert w.requests[0].prompt_len == 964
    assert all(100 <= r.prompt_len <= 1024 and 100 <= r.output_len <= 1024 for r in w.requests)
    assert all(0 <= t <= 10_000 for r in w.requests for t in r.prompt_token_ids)


def test_w1_is_nano_vllms_draw_order():
    # Prompts first (each length, then its tokens), output lengths after all prompts.
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
    lens = [random.randint(100, 1024) for _ in range(256)]
    w = w1()
    assert [r.prompt_token_ids for r in w.requests] == prompts
    assert [r.output_len for r in w.requests] == lens


def test_random_lengths_stay_in_range_and_repeat():
    a = random_workload(100, 50, 200, range_ratio=0.5, vocab_limit=300, seed=3)
    assert all(50 <= r.prompt_len <= 150 and 25 <= r.output_len <= 75 for r in a.requests)
    assert all(0 <= t < 300 for r in a.requests for t in r.prompt_token_ids)
    assert len({r.prompt_len for r in a.requests}) > 10  # lengths really vary
    assert a == random_workload(100, 50, 200, range_ratio=0.5, vocab_limit=300, seed=3)
    fixed = random_workload(7, 3, 4)
    assert {(r.prompt_len, r.output_len) for r in fixed.requests} == {(7, 3)}


def test_head_is_a_named_prefix():
    w = w1()
    sub = w.head(32)
    assert sub.requests == w.requests[:32] and sub.name == "w1[:32]"
    assert w.head(None) is w and w.head(1000) is w
    with pytest.raises(ValueError):
        w.head(0)


def test_make_workload_checks_its_arguments():
    with pytest.raises(ValueError, match="--input-len"):
        make_workload("random", output_len=3, num_prompts=2)
    with pytest.raises(ValueError, match="range_ratio"):
        make_workload("random", input_len=3, output_len=3, num_prompts=2, range_ratio=1.5)
    with pytest.raises(ValueError, match="Unknown workload"):
        make_workload("w2")
    small = make_workload("random", input_len=8, output_len=2, num_prompts=3, vocab_size=50)
    assert max(t for r in small.requests for t in r.prompt_token_ids) < 50
    assert make_workload("w1", num_prompts=5).num_requests == 5
