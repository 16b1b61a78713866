"""The engine in a process of its own (`folio serve --engine-process`): same answers, same lifecycle."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
from openai import OpenAI

from folio.engine.arg_utils import EngineArgs
from folio.engine.async_llm import AsyncLLM
from tests.server.conftest import API_KEY
from tests.server.harness import HANG_LIMIT_S, ServerThread, make_engine, wait_for

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def process_server(checkpoint):
    with ServerThread(make_engine(checkpoint, engine_process=True)) as running:
        yield running


@pytest.fixture
def process_client(process_server):
    with OpenAI(base_url=process_server.base_url, api_key=API_KEY, max_retries=0) as c:
        yield c


def test_answers_equal_the_threaded_engine(process_client, client, model_name):
    for api in (process_client, client):
        assert api.models.list().data[0].id == model_name
    kwargs = dict(model=model_name, prompt=["Once upon a time", "Hello"], max_tokens=12, logprobs=2, echo=True, **GREEDY)
    here, there = process_client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.text for c in here.choices] == [c.text for c in there.choices]
    assert [c.logprobs.tokens for c in here.choices] == [c.logprobs.tokens for c in there.choices]
    assert here.usage.prompt_tokens == there.usage.prompt_tokens > 0
    chat = dict(model=model_name, messages=MESSAGES, max_tokens=10, n=2, temperature=1.0, seed=5)
    assert ([c.message.content for c in process_client.chat.completions.create(**chat).choices]
            == [c.message.content for c in client.chat.completions.create(**chat).choices])


def test_streaming_equals_whole(process_client, model_name):
    whole = process_client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=30, **GREEDY)
    chunks = list(process_client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=30,
                                                    stream=True, stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 30 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_disconnect_aborts_and_frees_every_block(process_server, model_name):
    llm = process_server.engine
    body = {"model": model_name, "prompt": "Hi", "max_tokens": 250, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{process_server.base_url}/completions", json=body, timeout=HANG_LIMIT_S) as r:
        events = r.iter_lines()
        first = [next(events) for _ in range(4)]
    assert all('"finish_reason":null' in e for e in first if e)
    wait_for(lambda: llm.num_in_flight == 0, "the server to notice the disconnect")
    wait_for(lambda: llm.stats().num_running + llm.stats().num_waiting == 0, "the abort to reach the engine")
    stats = llm.stats()
    assert stats.num_free_blocks == stats.num_blocks


def test_a_killed_engine_process_fails_requests_and_health(checkpoint):
    with ServerThread(make_engine(checkpoint, engine_process=True)) as dying:
        body = {"prompt": "Hi", "max_tokens": 250, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{dying.base_url}/completions", json=body, timeout=HANG_LIMIT_S) as r:
            events = r.iter_lines()
            assert next(events).startswith("data: ")
            os.kill(dying.engine.core.process.pid, signal.SIGKILL)
            rest = [line for line in events if line]
        assert rest[-1] == "data: [DONE]"
        assert "engine process exited" in json.loads(rest[-2][len("data: "):])["error"]["message"]
        assert httpx.get(f"{dying.url}/health").status_code == 503
        assert httpx.post(f"{dying.base_url}/completions", json={"prompt": "Hi"}).status_code == 503


def test_an_engine_that_cannot_start_says_why(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        AsyncLLM.from_engine_args(EngineArgs(model=str(tmp_path), device="cpu"), engine_process=True)


def test_embeddings_from_an_engine_process_are_cut_at_its_own_step_limits(checkpoint):
    """The engine process tells its scheduler's limits at start (Ready), so AsyncLLM.embed cuts its
    chunks where the pooler cuts its batches, not at the defaults (a review of session 27's fix)."""
    engine = make_engine(checkpoint, engine_process=True, max_num_batched_tokens=512, max_num_seqs=3)
    with ServerThread(engine) as running:
        sched = running.engine.core.scheduler_config
        assert (sched.max_num_batched_tokens, sched.max_num_seqs) == (512, 3)
        prompts = [[5] * 100] * 4 + [[6] * 250] * 2  # three prompts or 512 tokens a chunk at most
        assert [len(c) for c in running.engine.embed_chunks(prompts)] == [3, 2, 1]
        r = httpx.post(f"{running.base_url}/embeddings", json={"input": prompts}, timeout=HANG_LIMIT_S)
        assert r.status_code == 200 and len(r.json()["data"]) == 6, r.text
