"""The served engine's warm-up: runs its requests to the end and leaves nothing that changes a
client's results (on the CPU it is skipped unless forced; the test forces it)."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from folio.engine import warm_up as warm_up_module
from folio.engine.warm_up import warm_up, wants_warm_up
from tests.helpers.checkpoints import tiny_model_dir


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama")


def _generate(llm: LLM) -> list[list[int]]:
    prompts = [{"prompt_token_ids": [1, 5, 9, 2 + i, 7]} for i in range(3)]
    params = SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True)  # the engine's own generator
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_warm_up_finishes_its_requests_and_changes_no_result(path, monkeypatch):
    fresh = _generate(LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=128))
    llm = LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=128)
    engine = llm.llm_engine
    assert not wants_warm_up(engine)  # the CPU: nothing to warm
    assert warm_up(engine) == 0.0 and engine.stats().num_computed_tokens == 0
    monkeypatch.setattr(warm_up_module, "FILL", 40.0)  # prompts past max_model_len - OUTPUT_LEN: clipped
    assert warm_up(engine, force=True) > 0
    assert not engine.has_unfinished_requests()
    assert engine.stats().num_computed_tokens > 0  # it really ran
    assert _generate(llm) == fresh  # no state a client's request can see


def test_warm_up_refuses_an_engine_that_already_serves(path):
    llm = LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=128)
    llm.llm_engine.add_request("client-1", {"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="already has requests"):
        warm_up(llm.llm_engine, force=True)


def test_warm_up_fits_a_short_context_and_never_fails_the_server(path, monkeypatch):
    llm = LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=6)
    assert warm_up(llm.llm_engine, force=True) > 0  # prompts and outputs cut to fit 6 tokens
    engine = LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=128).llm_engine
    calls = []

    def broken_step():
        calls.append(1)
        raise RuntimeError("a step failed")

    monkeypatch.setattr(engine, "step", broken_step)
    assert warm_up(engine, force=True) == 0.0  # logged and abandoned
    assert calls == [1] and not engine.has_unfinished_requests()


def test_a_lone_long_prompt_is_prefilled_in_a_step_of_its_own(path, monkeypatch):
    """The long-chunk prefill path runs only with few sequences in a step: the warm-up's first step
    holds one prompt of a quarter of max_num_batched_tokens (clipped to the context) and nothing else."""
    llm = LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=128, max_num_batched_tokens=256)
    engine = llm.llm_engine
    added, steps = [], []
    add, step = engine.add_request, engine.step
    monkeypatch.setattr(engine, "add_request", lambda rid, prompt, params: (
        added.append(len(prompt["prompt_token_ids"])), add(rid, prompt, params))[1])
    monkeypatch.setattr(engine, "step", lambda: (steps.append(len(added)), step())[1])
    assert warm_up(engine, force=True) > 0
    assert steps[0] == 1 and added[0] == 64  # 256 / 4, alone in the first step
    assert len(added) == 1 + warm_up_module.REQUESTS and not engine.has_unfinished_requests()
