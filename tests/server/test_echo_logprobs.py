"""echo with logprobs and n > 1: the prompt's log-probs are built once per prompt and shared by
its choices. Found by a review: built per choice, echo + logprobs=20 + n=128 over a 2,000-token
prompt held the event loop ~2 s. The answer must stay what the per-choice construction gave."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from folio.engine.async_llm import RequestStream
from folio.entrypoints.openai import serving_completion
from folio.entrypoints.openai.logprobs import completion_logprobs
from folio.entrypoints.openai.protocol import CompletionRequest
from folio.entrypoints.openai.serving_completion import OpenAIServingCompletion, _Call
from folio.entrypoints.openai.serving_engine import EnginePrompt
from folio.outputs import CompletionOutput, Logprob, RequestOutput
from tests.helpers.tokenizers import test_tokenizer

PROMPTS, PROMPT_LEN, N, GENERATED, TOP = 2, 40, 5, 3, 4


def _entry(rng: random.Random, token_id: int) -> dict[int, Logprob]:
    entry = {token_id: Logprob(-2.5, rank=TOP + 3)}
    for rank in range(1, TOP + 1):
        entry[rng.randrange(1000)] = Logprob(-0.25 * rank, rank=rank)
    return entry


def _outputs(seed: int = 0) -> list[RequestOutput]:
    rng = random.Random(seed)
    outputs = []
    for p in range(PROMPTS):
        prompt = [rng.randrange(1000) for _ in range(PROMPT_LEN)]
        choices = []
        for j in range(N):
            ids = [rng.randrange(1000) for _ in range(GENERATED)]
            choices.append(CompletionOutput(j, f"t{p}{j}", ids, -1.0, [_entry(rng, t) for t in ids], "length"))
        prompt_logprobs = [None] + [_entry(rng, t) for t in prompt[1:]]
        outputs.append(RequestOutput(f"r-{p}", f"p{p}", prompt, prompt_logprobs, choices, True))
    return outputs


def _serving_and_call(stream: bool) -> tuple[OpenAIServingCompletion, _Call, list[RequestOutput]]:
    serving = OpenAIServingCompletion.__new__(OpenAIServingCompletion)  # no engine: only the answer's shape
    serving.tokenizer = test_tokenizer()
    outputs = _outputs()
    request = CompletionRequest(prompt=["a", "b"], echo=True, logprobs=TOP, n=N, max_tokens=GENERATED, stream=stream)
    prompts = [EnginePrompt(list(o.prompt_token_ids), o.prompt) for o in outputs]
    return serving, _Call(request, "cmpl-1", 0, "m", prompts), outputs


def _per_choice(tokenizer, output: RequestOutput, c: CompletionOutput) -> dict:
    """What each choice's log-probs were before: the prompt's and its own, converted together."""
    ids = list(output.prompt_token_ids) + list(c.token_ids)
    logprobs, _ = completion_logprobs(tokenizer, ids, list(output.prompt_logprobs) + list(c.logprobs), 0)
    return json.loads(logprobs.model_dump_json())


@pytest.fixture
def converted(monkeypatch) -> list[int]:
    """The number of tokens completion_logprobs converts, call by call."""
    counts: list[int] = []

    def counting(tokenizer, token_ids, entries, text_offset):
        counts.append(len(token_ids))
        return completion_logprobs(tokenizer, token_ids, entries, text_offset)

    monkeypatch.setattr(serving_completion, "completion_logprobs", counting)
    return counts


def test_whole_response_converts_each_prompt_once_and_equals_the_per_choice_answer(converted):
    serving, call, outputs = _serving_and_call(stream=False)
    response = json.loads(serving._response(call, outputs).model_dump_json())
    assert sum(converted) == PROMPTS * (PROMPT_LEN + N * GENERATED)  # was PROMPTS * N * (PROMPT_LEN + GENERATED)
    assert len(response["choices"]) == PROMPTS * N
    for choice in response["choices"]:
        output = outputs[choice["index"] // N]
        assert choice["logprobs"] == _per_choice(serving.tokenizer, output, output.outputs[choice["index"] % N])


def test_stream_converts_each_prompt_once_and_equals_the_per_choice_answer(converted):
    serving, call, outputs = _serving_and_call(stream=True)

    async def events() -> list[str]:
        streams = [RequestStream(o.request_id, lambda _: None) for o in outputs]
        for stream, output in zip(streams, outputs):
            stream.put(output)
        return [e async for e in serving._events(call, streams)]

    chunks = [json.loads(e[len("data: "):]) for e in asyncio.run(events())[:-1]]
    assert sum(converted) == PROMPTS * (PROMPT_LEN + N * GENERATED)
    choices = {c["index"]: c for chunk in chunks for c in chunk["choices"]}
    assert sorted(choices) == list(range(PROMPTS * N))
    for index, choice in choices.items():
        output = outputs[index // N]
        assert choice["logprobs"] == _per_choice(serving.tokenizer, output, output.outputs[index % N])


@pytest.mark.slow
def test_over_http_every_choice_begins_with_the_same_prompt_logprobs(server):
    body = {"prompt": "Once upon a time there was", "echo": True, "logprobs": 3, "n": 4, "max_tokens": 3}
    r = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    num_prompt = r.json()["usage"]["prompt_tokens"]
    heads = [{k: v[:num_prompt] for k, v in c["logprobs"].items()} for c in choices]
    assert all(head == heads[0] for head in heads) and len(heads[0]["tokens"]) == num_prompt
    for c in choices:
        logprobs = c["logprobs"]
        assert len(logprobs["tokens"]) == num_prompt + 3
        offsets = logprobs["text_offset"]
        assert offsets == [sum(map(len, logprobs["tokens"][:k])) for k in range(len(offsets))]
