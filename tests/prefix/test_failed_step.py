"""A step that fails after scheduling must not leave its prefix-cache entries behind: the blocks
were registered when scheduled, but their K/V was never written, and a later request sharing the
prefix would read garbage (found by a review of the offline API: 29-32 of 32 outputs wrong)."""

from __future__ import annotations

import random

import pytest

from tests.prefix.helpers import greedy, make_llm, token_prompts

pytestmark = pytest.mark.slow


class _Boom(RuntimeError):
    pass


def _fail_next_forward(runner, monkeypatch) -> None:
    original = runner.launch_forward

    def launch_forward(scheduler_output):
        monkeypatch.setattr(runner, "launch_forward", original)  # once
        raise _Boom("the forward pass failed")

    monkeypatch.setattr(runner, "launch_forward", launch_forward)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prompts_after_a_failed_step_match_a_fresh_engine(checkpoint, monkeypatch, async_scheduling):
    rng = random.Random(3)
    prefix = [rng.randrange(3, 1000) for _ in range(64)]  # 4 full blocks of 16
    prompts = [prefix + [rng.randrange(3, 1000) for _ in range(5 + i)] for i in range(6)]
    params = greedy(6)
    path = checkpoint("llama")
    reference = [o.outputs[0].token_ids for o in make_llm(path, enable_prefix_caching=False).generate(
        token_prompts(prompts), params, use_tqdm=False)]

    llm = make_llm(path, enable_prefix_caching=True, async_scheduling=async_scheduling)
    _fail_next_forward(llm.llm_engine.runner, monkeypatch)
    with pytest.raises(_Boom):
        llm.generate(token_prompts(prompts[:3]), params, use_tqdm=False)
    outputs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    # the cache works again after the failure: the prefix is computed once more, then shared
    assert max(o.num_cached_tokens for o in outputs) >= 48
