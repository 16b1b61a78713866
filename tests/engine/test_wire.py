"""engine/wire.py: what the server rebuilds from the engine process's records equals what the
engine would have returned, for every kind of request; streamed records carry the common case."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest

from folio.core.outputs import EngineCoreOutput, PromptLogprobsChunk, TokenLogprobs
from folio.engine import output_processor as output_processor_module
from folio.engine.output_processor import OutputProcessor
from folio.engine.wire import STREAMED_RECORD_LEN, WireDecoder, WireEncoder, finished_request_ids
from folio.sampling_params import RequestOutputKind, SamplingParams
from tests.helpers.tokenizers import test_tokenizer

DELTA, FINAL = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
PROMPT = [5, 6, 7, 8]


class Clock:
    """time.monotonic for output_processor: one tick per call, the same in both processors."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        self.now += 0.5
        return self.now


def _params(**kwargs) -> SamplingParams:
    kwargs.setdefault("max_tokens", 1000)
    return SamplingParams(output_kind=kwargs.pop("output_kind", DELTA), **kwargs)


# name -> (params, number of samples the engine runs, whether steps carry log-probs)
REQUESTS = {
    "plain": (_params(), 1),
    "stop-string": (_params(stop=["the", "ab"]), 1),
    "stop-string-kept": (_params(stop=["the"], include_stop_str_in_output=True), 1),
    "logprobs": (_params(logprobs=2), 1),
    "prompt-logprobs": (_params(prompt_logprobs=1), 1),
    "n2": (_params(n=2, temperature=1.0), 2),
    "best-of": (_params(n=1, best_of=2, temperature=1.0), 2),
    "final": (_params(output_kind=FINAL), 1),
    "no-detokenize": (_params(detokenize=False), 1),
    "aborted": (_params(), 1),
    "cached-later": (_params(), 1),
}


def _register(processor: OutputProcessor, decoder: WireDecoder | None) -> dict[str, list[str]]:
    core_ids = {}
    for name, (params, samples) in REQUESTS.items():
        ids = [name] if samples == 1 else [f"{name}-{i}" for i in range(samples)]
        children = [params] * samples
        if params.best_of and params.best_of > params.n:  # best_of samples track cumulative log-probs
            children = [SamplingParams(max_tokens=1000, logprobs=0, temperature=1.0) for _ in ids]
        processor.add_request(name, "a prompt", PROMPT, params, ids, children, 1.0)
        if decoder is not None:
            decoder.add(name, "a prompt", PROMPT)
            decoder.accepted([name])  # the engine answered the add
        core_ids[name] = ids
    return core_ids


def _steps(core_ids: dict[str, list[str]], seed: int) -> list[list[EngineCoreOutput]]:
    """Random tokens for every sample; finishing by length, by a stop token, or not at all."""
    rng = random.Random(seed)
    steps = []
    for step in range(12):
        outs = []
        for name, ids in core_ids.items():
            for core_id in ids:
                if name == "aborted" and step >= 5:
                    continue
                tokens = [rng.randrange(30, 400)] if step > 0 or name != "plain" else []
                out = EngineCoreOutput(core_id, tokens, num_cached_tokens=2 if name != "cached-later" or step < 4 else 3)
                if REQUESTS[name][0].logprobs is not None and tokens:
                    out.new_logprobs = [TokenLogprobs([tokens[0], 1, 2], [-0.5, -0.1, -0.9], 3)]
                if name == "prompt-logprobs" and step == 0:
                    out.new_prompt_logprobs = PromptLogprobsChunk(1, [TokenLogprobs([6], [-1.0], 4),
                                                                      TokenLogprobs([7], [-2.0], 9)])
                if step == 11:
                    out.finish_reason, out.stop_reason = ("stop", 2) if rng.random() < 0.5 else ("length", None)
                outs.append(out)
        steps.append(outs)
    return steps


def _as_sent(outputs, sent: set[str]):
    """Prompt log-probs go once, with the first output that has tokens (the server keeps them)."""
    for output in outputs:
        if output.prompt_logprobs is not None and any(c.token_ids for c in output.outputs):
            if output.request_id in sent:
                output.prompt_logprobs = None
            sent.add(output.request_id)
    return outputs


@pytest.mark.parametrize("seed", range(4))
def test_records_decode_to_the_engines_outputs(monkeypatch, seed):
    clock = Clock()
    monkeypatch.setattr(output_processor_module, "time", clock)
    plain, wired = OutputProcessor(test_tokenizer()), OutputProcessor(test_tokenizer())
    wired.wire_records = True
    decoder, encoder = WireDecoder(), WireEncoder()
    core_ids = _register(plain, None)
    _register(wired, decoder)
    streamed, sent = 0, set()
    for step, outs in enumerate(_steps(core_ids, seed)):
        if step == 5:
            for processor in (plain, wired):
                processor.abort_requests(["aborted"])
            decoder.forget("aborted")
        start = clock.now
        expected, stopped = plain.process_outputs(outs)
        clock.now = start  # the same step time for the wired processor
        got, wired_stopped = wired.process_outputs(outs)
        assert wired_stopped == stopped
        assert finished_request_ids(got) == [o.request_id for o in expected if o.finished]
        records = pickle.loads(pickle.dumps(encoder.encode(got)))
        streamed += sum(len(r) == STREAMED_RECORD_LEN for r in records)
        assert [decoder.decode(r) for r in records] == _as_sent(expected, sent), f"step {step}"
    assert streamed >= 4 * 8  # plain, stop strings, no-detokenize, cached-later: most of their steps
    assert len(decoder) == 0  # every request finished or was forgotten


def test_the_first_output_goes_in_full_and_a_failure_still_fails_the_request_alone(monkeypatch):
    monkeypatch.setattr(output_processor_module, "time", Clock())
    processor = OutputProcessor(test_tokenizer())
    processor.isolate_errors = processor.wire_records = True
    decoder, encoder = WireDecoder(), WireEncoder()
    processor.add_request("r", None, PROMPT, _params(), ["r"], [_params()], 1.0)
    decoder.add("r", None, PROMPT)
    decoder.accepted(["r"])
    for step in range(3):
        outputs, _ = processor.process_outputs([EngineCoreOutput("r", [40 + step], num_cached_tokens=1)])
        (record,) = encoder.encode(outputs)
        assert len(record) == (STREAMED_RECORD_LEN if step else 6)
        assert decoder.decode(record).metrics.first_token_time == 100.5
    processor.samples["r"][1].params = None  # the next step raises while processing this request
    outputs, _ = processor.process_outputs([EngineCoreOutput("r", [50])])
    assert outputs == [] and list(processor.take_errors()) == ["r"]


@pytest.mark.slow
def test_a_real_engine_streams_records_that_decode_to_its_outputs(tmp_path_factory):
    """Two engines on one checkpoint step the same requests; the one making records (as in the
    engine process) decodes, step by step, to the other's outputs (times aside: two clocks)."""
    from folio import LLM
    from tests.helpers.checkpoints import tiny_model_dir

    path = tiny_model_dir(tmp_path_factory, "llama")
    plain, wired = (LLM(model=path, dtype="float32", device="cpu", max_model_len=256, seed=0).llm_engine
                    for _ in range(2))
    wired.output_processor.wire_records = True
    decoder, encoder = WireDecoder(), WireEncoder()
    requests = {
        "greedy": _params(temperature=0, max_tokens=12, ignore_eos=True),
        "stop": _params(temperature=0, max_tokens=12, ignore_eos=True, stop=["e", "an"]),
        "one-token": _params(temperature=0, max_tokens=1),
        "logprobs": _params(temperature=0, max_tokens=6, logprobs=2, prompt_logprobs=1),
        "n2": _params(temperature=1.0, seed=3, max_tokens=6, n=2),
    }
    for name, params in requests.items():
        prompt = {"prompt": f"Once upon a time, {name}"}
        for engine in (plain, wired):
            engine.add_request(name, prompt, params)
        decoder.add(name, prompt["prompt"], plain.output_processor.requests[name].prompt_token_ids)
        decoder.accepted([name])
    streamed, sent = 0, set()
    while plain.has_unfinished_requests():
        expected = _as_sent(plain.step(), sent)
        records = pickle.loads(pickle.dumps(encoder.encode(wired.step())))
        streamed += sum(len(r) == STREAMED_RECORD_LEN for r in records)
        got = [decoder.decode(r) for r in records]
        assert [dataclasses.replace(o, metrics=None) for o in got] == [dataclasses.replace(o, metrics=None) for o in expected]
        for output in got:
            m = output.metrics
            assert m.first_token_time <= m.last_token_time and (m.finished_time == m.last_token_time) == output.finished
    assert not wired.has_unfinished_requests() and len(decoder) == 0
    assert streamed >= 10
