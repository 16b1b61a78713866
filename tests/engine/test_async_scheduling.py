"""Async scheduling end to end: the same outputs as synchronous steps, for every sampling
feature, under preemption and chunked prefill, with steps that really overlap (on the CPU, and
on a GPU with CUDA graphs when there is one)."""

from __future__ import annotations

import argparse

import pytest
import torch

from folio import LLM, SamplingParams
from folio.engine.arg_utils import EngineArgs
from folio.sampling_params import BeamSearchParams
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, my name is", "The capital of France is", "Once upon a time", "In 1905", "a b c d e f g h"]


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama")


CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
)


def _llm(path: str, async_scheduling: bool, device: str = "cpu", **kwargs) -> LLM:
    kwargs = {"max_model_len": 128, **kwargs}
    if device == "cuda":  # several engines live in one process: none may take the whole GPU
        kwargs.setdefault("num_gpu_blocks_override", 256)
    return LLM(model=path, dtype="float32", device=device, seed=0, async_scheduling=async_scheduling, **kwargs)


def _count_overlaps(llm: LLM) -> list[int]:
    """Counts the steps launched with placeholders (input ids gathered on the device)."""
    runner, counter = llm.llm_engine.runner, [0]
    fill = runner.last_sampled.fill

    def counted(*args):
        counter[0] += 1
        return fill(*args)

    runner.last_sampled.fill = counted
    return counter


def _summary(outputs):
    return [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs
    ]


def _logprobs(outputs):
    return [[c.logprobs for c in o.outputs] + [o.prompt_logprobs] for o in outputs]


MIXED = [
    SamplingParams(temperature=0, max_tokens=20, stop=[" the", "e"]),  # stop strings
    SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=15, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=12, logprobs=3, prompt_logprobs=2, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=5, seed=3, n=2, max_tokens=10, min_tokens=4),
    SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[5, 9, 11], min_tokens=2),
]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"num_gpu_blocks_override": 12, "block_size": 4, "max_model_len": 48, "max_num_batched_tokens": 16}],
    ids=["roomy", "preempting-chunked"],
)
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_async_steps_give_the_synchronous_outputs(path, kwargs, device):
    sync = _llm(path, False, device, **kwargs)
    want = sync.generate(PROMPTS, MIXED, use_tqdm=False)
    llm = _llm(path, True, device, **kwargs)
    overlaps = _count_overlaps(llm)
    got = llm.generate(PROMPTS, MIXED, use_tqdm=False)
    assert _summary(got) == _summary(want)
    assert _close(_logprobs(got), _logprobs(want))
    assert overlaps[0] > 0
    engine = llm.llm_engine
    assert engine._in_flight is None and not engine.has_unfinished_requests()
    assert engine.stats().num_free_blocks == engine.stats().num_blocks
    if kwargs:
        assert engine.stats().num_preemptions > 0


def _close(a, b) -> bool:
    """Log-prob structures equal up to float rounding (batch shapes differ between the modes)."""
    if isinstance(a, float):
        return abs(a - b) < 1e-4
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if hasattr(a, "logprob"):
        return a.rank == b.rank and a.decoded_token == b.decoded_token and _close(a.logprob, b.logprob)
    return a == b


def test_penalties_and_beams_make_steps_synchronous(path):
    penalised = SamplingParams(temperature=0, max_tokens=16, presence_penalty=1.5, repetition_penalty=1.3)
    plain = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = _llm(path, False).generate(PROMPTS[:2], [penalised, plain], use_tqdm=False)
    llm = _llm(path, True)
    overlaps = _count_overlaps(llm)
    got = llm.generate(PROMPTS[:2], [penalised, plain], use_tqdm=False)
    assert _summary(got) == _summary(want) and overlaps[0] == 0
    beams = BeamSearchParams(beam_width=3, max_tokens=6)
    prompts = [{"prompt_token_ids": [3, 4, 5, 6]}]
    assert (
        [b.tokens for b in llm.beam_search(prompts, beams)[0].sequences]
        == [b.tokens for b in _llm(path, False).beam_search(prompts, beams)[0].sequences]
    )
    assert llm.generate(PROMPTS[1], plain, use_tqdm=False)[0].outputs[0].token_ids == got[1].outputs[0].token_ids
    assert overlaps[0] > 0  # plain requests alone overlap again


def test_abort_while_a_step_is_in_flight(path):
    llm = _llm(path, True)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (alone,) = llm.generate(PROMPTS[1], params, use_tqdm=False)
    engine.add_request("a", PROMPTS[0], params)
    engine.add_request("b", PROMPTS[1], params)
    engine.step()
    engine.step()
    assert engine._in_flight is not None  # the next step, with "a" in it, is running
    engine.abort_request("a")
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [o.request_id for o in outputs if o.finished] == ["b"]
    b = [o for o in outputs if o.request_id == "b"][-1]
    assert b.outputs[0].token_ids == alone.outputs[0].token_ids
    assert engine._in_flight is None
    assert engine.stats().num_free_blocks == engine.stats().num_blocks
    # Aborting the last request settles the step in flight at once (the engine goes idle clean).
    engine.add_request("c", PROMPTS[2], params)
    engine.step()
    engine.step()
    assert engine._in_flight is not None
    engine.abort_request("c")
    assert engine._in_flight is None and not engine.has_unfinished_requests()
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_the_switch():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    assert EngineArgs.from_cli_args(parser.parse_args([])).async_scheduling
    args = EngineArgs.from_cli_args(parser.parse_args(["--no-async-scheduling"]))
    assert not args.async_scheduling
    assert not args.create_engine_config().scheduler.async_scheduling
