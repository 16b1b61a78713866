"""/v1/completions refuses a request with more sequences (prompts x n) than the waiting queue
holds before tokenizing its prompts. Found by a review: {"prompt": ["ab"] * 20000} spent ~1.1 s
of the event loop tokenizing, and was then refused anyway. The 400 is the one the engine gives
(AsyncLLM._check_accepting, tests/server/test_queue_admission.py): same words, same param."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from folio.engine.async_llm import AsyncLLM
from folio.entrypoints.openai.errors import BadRequestError
from folio.entrypoints.openai.protocol import CompletionRequest
from folio.entrypoints.openai.serving_completion import OpenAIServingCompletion
from folio.sampling_params import SamplingParams, SamplingParamsError
from tests.server.harness import api_error
from tests.server.test_ingest_paths import StubCore


class Tokenized(Exception):
    """Raised by the stub tokenizer: the request got as far as tokenizing."""


def _serving(limit: int) -> tuple[OpenAIServingCompletion, AsyncLLM]:
    """A serving over an engine that answers nothing, whose tokenizer raises Tokenized (call
    from the event loop)."""
    llm = AsyncLLM(core=StubCore(), max_waiting_requests=limit)
    llm.start()
    serving = OpenAIServingCompletion(llm, "m")

    async def encode_async(*args, **kwargs):
        raise Tokenized

    serving.encode_async = encode_async
    return serving, llm


async def _engine_error(llm: AsyncLLM, num_prompts: int, n: int) -> SamplingParamsError:
    """What the engine raises when a request of this shape is added."""
    requests = [(f"r{i}", {"prompt_token_ids": [1]}, SamplingParams(n=n)) for i in range(num_prompts)]
    with pytest.raises(SamplingParamsError) as info:
        await llm.add_requests(requests)
    return info.value


@pytest.mark.parametrize("prompt, n, num_prompts", [
    (["ab"] * 5, 1, 5),
    ("ab", 5, 1),
    (["ab", "cd"], 3, 2),
    ([1, 2, 3], 5, 1),  # token ids: one prompt
    ([[1, 2], [3]] * 3, 1, 6),  # a batch of token id lists
])
def test_too_many_sequences_is_the_engines_400_before_tokenizing(prompt, n, num_prompts):
    async def main():
        serving, llm = _serving(4)
        with pytest.raises(BadRequestError) as info:
            await serving.create(CompletionRequest(prompt=prompt, n=n, max_tokens=1))
        engine = await _engine_error(llm, num_prompts, n)
        assert (info.value.message, info.value.param) == (str(engine), engine.param)
        assert llm._pending_sequences == 0 and llm.num_in_flight == 0

    asyncio.run(main())


def test_a_request_that_fits_the_queue_is_tokenized():
    async def main():
        serving, _ = _serving(4)
        with pytest.raises(Tokenized):
            await serving.create(CompletionRequest(prompt=["ab"] * 2, n=2, max_tokens=1))  # 4: the limit

    asyncio.run(main())


@pytest.mark.slow
def test_over_http_20000_prompts_are_refused_untokenized(server, monkeypatch):
    encoded: list[str] = []
    encode = OpenAIServingCompletion.encode

    def counting(self, text, *args, **kwargs):
        encoded.append(text)
        return encode(self, text, *args, **kwargs)

    monkeypatch.setattr(OpenAIServingCompletion, "encode", counting)
    llm = server.engine
    llm.max_waiting_requests, saved = 8, llm.max_waiting_requests
    try:
        body = {"prompt": ["ab"] * 20000, "max_tokens": 1}
        error = api_error(httpx.post(f"{server.base_url}/completions", json=body, timeout=60), 400)
        assert error["param"] == "prompt" and "20000 sequences (20000 prompt(s) x n=1)" in error["message"]
        assert encoded == []
        ok = {"prompt": ["ab"] * 4, "n": 2, "max_tokens": 1}  # 8: exactly the limit
        assert httpx.post(f"{server.base_url}/completions", json=ok, timeout=60).status_code == 200
        assert len(encoded) == 4
    finally:
        llm.max_waiting_requests = saved
