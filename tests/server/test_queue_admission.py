"""Admission to the waiting queue (--max-waiting-requests), found by a fuzzing review: a request
whose own sequences (prompts x n) exceed the limit got a 503 "retry later" although it can never
be queued, and its prompts were added one by one, so the partial adds counted until the engine
answered and other clients got 503 too. Now the whole request is checked once, before anything is
added: more than the limit alone is a 400, more than the room left a 503 that adds nothing."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from folio.engine.async_llm import AsyncLLM, QueueFullError
from folio.engine.engine_loop import Accepted, AddCommand
from folio.entrypoints.openai.errors import BadRequestError, ServiceUnavailableError
from folio.entrypoints.openai.serving_engine import EnginePrompt, OpenAIServing
from folio.sampling_params import SamplingParams, SamplingParamsError
from tests.server.harness import api_error, wait_for
from tests.server.test_ingest_paths import StubCore


def _started(limit: int, waiting: int = 0) -> tuple[AsyncLLM, StubCore]:
    core = StubCore()
    llm = AsyncLLM(core=core, max_waiting_requests=limit)
    llm.start()
    llm._stats = replace(llm._stats, num_waiting=waiting)
    return llm, core


def _add(llm: AsyncLLM, num_prompts: int, n: int = 1):
    serving = OpenAIServing(llm, "m")
    adding = serving.add_requests("cmpl-1", [EnginePrompt([1, 2])] * num_prompts, [SamplingParams(n=n)] * num_prompts)
    return asyncio.wait_for(adding, 10)  # the stub core answers no add by itself


@pytest.mark.parametrize("num_prompts, n, param", [(5, 1, "prompt"), (1, 5, "n"), (3, 2, "n")])
def test_a_request_bigger_than_the_queue_is_a_400_and_adds_nothing(num_prompts, n, param):
    async def main():
        llm, core = _started(limit=4)
        with pytest.raises(BadRequestError) as info:
            await _add(llm, num_prompts, n)
        assert info.value.param == param
        assert f"asks for {num_prompts * n} sequences" in info.value.message and "at most 4" in info.value.message
        assert core.sent == [] and llm._pending_sequences == 0 and llm.num_in_flight == 0
        # the engine API says the same (a ValueError naming the field), whatever the caller
        with pytest.raises(SamplingParamsError):
            await asyncio.wait_for(llm.add_requests([(f"r{i}", {"prompt_token_ids": [1]}, SamplingParams(n=n))
                                                     for i in range(num_prompts)]), 10)

    asyncio.run(main())


def test_a_request_bigger_than_the_room_left_is_a_503_and_adds_nothing():
    async def main():
        llm, core = _started(limit=4, waiting=2)
        with pytest.raises(ServiceUnavailableError) as info:
            await _add(llm, 3)  # fits the queue, not the room left (2): before, two of three were added
        assert info.value.code == "queue_full" and "retry later" in info.value.message
        assert core.sent == [] and llm._pending_sequences == 0 and llm.num_in_flight == 0
        with pytest.raises(QueueFullError):
            await asyncio.wait_for(llm.add_request("one", {"prompt_token_ids": [1]}, SamplingParams(n=3)), 10)
        assert core.sent == []

    asyncio.run(main())


def test_a_request_that_fits_is_sent_at_once_and_accepted_whole():
    async def main():
        llm, core = _started(limit=4, waiting=1)
        add = asyncio.ensure_future(_add(llm, 3))
        for _ in range(3):
            await asyncio.sleep(0)
        assert [type(c) for c in core.sent] == [AddCommand] * 3  # all in one go, before any answer
        assert llm._pending_sequences == 3
        # a concurrent request sees the whole batch as taken: no room is handed out twice
        with pytest.raises(ServiceUnavailableError):
            await _add(llm, 1)
        llm._on_message(Accepted([(c.request_id, 1, None) for c in core.sent], llm._stats))
        streams = await add
        assert [s.request_id for s in streams] == ["cmpl-1-0", "cmpl-1-1", "cmpl-1-2"]
        assert llm._pending_sequences == 0 and llm.num_in_flight == 3

    asyncio.run(main())


def test_over_http_a_too_big_request_is_a_400_and_the_next_request_is_served(server):
    llm = server.engine
    llm.max_waiting_requests, saved = 8, llm.max_waiting_requests
    try:
        body = {"prompt": ["a b", "a b", "a b"], "n": 3, "max_tokens": 1}
        error = api_error(httpx.post(f"{server.base_url}/completions", json=body, timeout=60), 400)
        assert error["param"] == "n" and "9 sequences" in error["message"] and "at most 8" in error["message"]
        beams = {"prompt": "a b", "n": 9, "use_beam_search": True, "max_tokens": 2}  # a beam counts its width
        error = api_error(httpx.post(f"{server.base_url}/completions", json=beams, timeout=60), 400)
        assert error["param"] == "n" and "9 sequences" in error["message"]
        # nothing of it was queued: the next request is served at once, not told to retry later
        r = httpx.post(f"{server.base_url}/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        ok = {"prompt": ["a b", "a b"], "n": 4, "max_tokens": 1}  # 8: exactly the limit
        assert httpx.post(f"{server.base_url}/completions", json=ok, timeout=60).status_code == 200
    finally:
        llm.max_waiting_requests = saved
    wait_for(lambda: llm.num_in_flight == 0 and llm._pending_sequences == 0, "the engine to be idle")
