"""/v1/embeddings (and /v1/score, /v1/rerank) must not hold the engine (found by a fuzzing review:
100 inputs x 2000 tokens froze every other request for 23 s, even after the client left).

The engine embeds a request a chunk of about one step's tokens at a time (AsyncLLM.embed),
generation steps running between chunks, and a client that leaves stops its next chunks; one
request is capped (2048 inputs, 300,000 tokens) with a 400 naming the field; `priority`, which
embeddings cannot honour, is a 400 instead of being ignored."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from folio.engine.async_llm import AsyncLLM, EngineDeadError
from folio.engine.engine_loop import Died, EmbedCommand, Embedded
from folio.entrypoints.openai.errors import BadRequestError
from folio.entrypoints.openai.protocol.embedding import EmbeddingRequest
from folio.entrypoints.openai.serving_embedding import MAX_INPUT_TOKENS, MAX_INPUTS, OpenAIServingEmbedding
from folio.pooling_params import PoolerConfig
from folio.worker.pooler import Pooler
from tests.server.harness import api_error, wait_for
from tests.server.test_ingest_paths import StubCore

# ---- chunks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_chunks_are_the_batches_the_pooler_would_make_of_the_whole_request(seed):
    rng = random.Random(seed)
    prompts = [[1] * rng.randint(1, 40) for _ in range(rng.randint(0, 60))]
    max_tokens, max_prompts = rng.randint(1, 100), rng.randint(1, 12)
    llm = AsyncLLM(core=StubCore())
    llm._embed_chunk_limits = (max_tokens, max_prompts)
    pooler = SimpleNamespace(max_batch_tokens=max_tokens, max_batch_prompts=max_prompts, block_pool=None,
                             _borrows=lambda: False, _blocks=lambda prompt: 1)
    chunks = llm.embed_chunks(prompts)
    assert chunks == (Pooler._batches(pooler, prompts) or [[]])  # so the vectors are the same as before
    assert [p for chunk in chunks for p in chunk] == prompts


def test_chunks_are_sent_one_at_a_time_and_a_cancelled_caller_sends_no_more():
    async def main():
        core = StubCore()
        llm = AsyncLLM(core=core)
        llm._embed_chunk_limits = (10, 100)
        llm.start()
        prompts = [[i] * 6 for i in range(5)]  # 6 tokens each: one prompt per chunk
        task = asyncio.ensure_future(llm.embed("embd-1", prompts, PoolerConfig()))
        for i in range(3):
            await asyncio.sleep(0)
            assert len(core.sent) == i + 1  # the next chunk waits for this one's answer
            command = core.sent[-1]
            assert isinstance(command, EmbedCommand) and command.prompts == [prompts[i]]
            llm._on_message(Embedded(command.request_id, [[float(i)]]))
        await asyncio.sleep(0)
        task.cancel()  # the client left while the 4th chunk was being embedded
        with pytest.raises(asyncio.CancelledError):
            await task
        llm._on_message(Embedded(core.sent[-1].request_id, [[3.0]]))  # its late answer is dropped
        await asyncio.sleep(0)
        assert len(core.sent) == 4 and not llm._embeds and not llm._embedding

        task = asyncio.ensure_future(llm.embed("embd-1", prompts[:2], PoolerConfig()))  # the id is free again
        await asyncio.sleep(0)
        llm._on_message(Embedded(core.sent[-1].request_id, [[0.0]]))
        await asyncio.sleep(0)
        llm._on_message(Embedded(core.sent[-1].request_id, [[1.0]]))
        assert await task == [[0.0], [1.0]]  # in order

        task = asyncio.ensure_future(llm.embed("embd-2", prompts, PoolerConfig()))
        await asyncio.sleep(0)
        llm._on_message(Embedded(core.sent[-1].request_id, [[0.0]]))
        llm._on_message(Died("boom"))  # between two chunks: no chunk is left waiting forever
        with pytest.raises(EngineDeadError):
            await task

    asyncio.run(main())


# ---- caps, checked before the texts are tokenized --------------------------------------------------


class Tokenizer:
    def __init__(self) -> None:
        self.encoded = 0

    def get_vocab(self) -> dict[str, int]:
        return {"abcd": 0}  # the longest token: 4 characters

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded += 1
        return [1] * len(text.split())


def _serving() -> tuple[OpenAIServingEmbedding, Tokenizer]:
    core = StubCore()
    core.tokenizer = Tokenizer()
    core.model_config = SimpleNamespace(max_model_len=100_000, vocab_size=100, served_model_name="m",
                                        pooler_config=PoolerConfig())
    return OpenAIServingEmbedding(AsyncLLM(core=core), "m"), core.tokenizer


def _refused(serving: OpenAIServingEmbedding, body: dict) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        asyncio.run(asyncio.wait_for(serving.create(EmbeddingRequest.model_validate(body)), 10))  # (stub: no answer)
    return info.value


def test_too_many_inputs_is_a_400_naming_input_before_any_tokenizing():
    serving, tokenizer = _serving()
    error = _refused(serving, {"input": ["a b"] * (MAX_INPUTS + 1)})
    assert error.param == "input" and f"at most {MAX_INPUTS}" in error.message and str(MAX_INPUTS + 1) in error.message
    assert tokenizer.encoded == 0


def test_too_many_tokens_is_a_400_naming_input_before_any_tokenizing_when_the_text_shows_it():
    serving, tokenizer = _serving()
    text = "x" * 16 * 60_000  # at least 60,000 tokens (16 characters at most per token, slack included)
    error = _refused(serving, {"input": [text] * 6})
    assert error.param == "input" and f"at most {MAX_INPUT_TOKENS}" in error.message and "at least" in error.message
    assert tokenizer.encoded == 0
    # token ids are counted exactly; texts once tokenized (here 1 token per word)
    error = _refused(serving, {"input": [[1] * 60_001] * 5})
    assert error.param == "input" and "300005 tokens" in error.message
    error = _refused(serving, {"input": ["a " * 50_001] * 6})  # 600 kB in all: tokenized on a worker thread
    assert error.param == "input" and "300006 tokens" in error.message and tokenizer.encoded == 6


# ---- over HTTP, on the tiny model ----------------------------------------------------------------


def _prompts(count: int, length: int) -> list[list[int]]:
    return [[5 + (i + j) % 40 for j in range(length - i % 7)] for i in range(count)]


def test_caps_and_priority_over_http(server):
    url = server.base_url
    error = api_error(httpx.post(f"{url}/embeddings", json={"input": [[5]] * 2049}, timeout=60), 400)
    assert error["param"] == "input" and "2048" in error["message"]
    error = api_error(httpx.post(f"{url}/embeddings", json={"input": [[5] * 250] * 1201}, timeout=60), 400)
    assert error["param"] == "input" and "300000" in error["message"]
    error = api_error(httpx.post(f"{url}/rerank", json={"query": "q", "documents": ["d"] * 2049}, timeout=60), 400)
    assert error["param"] == "documents" and "2048" in error["message"]
    texts = [f"t{i}" for i in range(2049)]
    error = api_error(httpx.post(f"{url}/score", json={"text_1": "q", "text_2": texts}, timeout=60), 400)
    assert error["param"] == "text_2"
    error = api_error(httpx.post(f"{url}/embeddings", json={"input": "hi", "priority": 7}, timeout=60), 400)
    assert error["param"] == "priority"
    assert httpx.post(f"{url}/embeddings", json={"input": "hi", "priority": 0}, timeout=60).status_code == 200


def test_chunked_vectors_are_those_of_one_command(server):
    llm = server.engine
    body = {"input": _prompts(40, 250)}  # 9,880 tokens: more than one step's 8,192, two chunks
    assert len(llm.embed_chunks(body["input"])) == 2
    chunked = httpx.post(f"{server.base_url}/embeddings", json=body, timeout=120).json()["data"]
    llm._embed_chunk_limits, saved = (10**9, 10**9), llm._embed_chunk_limits
    try:  # everything in one command: what the engine computed before
        whole = httpx.post(f"{server.base_url}/embeddings", json=body, timeout=120).json()["data"]
    finally:
        llm._embed_chunk_limits = saved
    assert [d["index"] for d in chunked] == list(range(40))
    assert [d["embedding"] for d in chunked] == [d["embedding"] for d in whole]


@pytest.fixture
def slow_embed(server):
    """The engine's embed, 50 ms a prompt, 4 prompts a chunk; records each call's prompts."""
    engine, llm = server.engine.engine, server.engine
    calls: list[int] = []
    real = engine.embed

    def embed(prompts, config):
        calls.append(len(prompts))
        time.sleep(0.05 * len(prompts))
        return real(prompts, config)

    engine.embed = embed
    llm._embed_chunk_limits, saved = (10**9, 4), llm._embed_chunk_limits
    try:
        yield calls
    finally:
        llm._embed_chunk_limits = saved
        del engine.embed


def test_generation_goes_on_while_a_big_embedding_request_runs(server, slow_embed):
    done: dict[str, float] = {}

    def embed():
        r = httpx.post(f"{server.base_url}/embeddings", json={"input": _prompts(64, 20)}, timeout=120)
        assert r.status_code == 200 and len(r.json()["data"]) == 64
        done["embedding"] = time.monotonic()

    thread = threading.Thread(target=embed)
    thread.start()
    wait_for(lambda: slow_embed, "the embedding to start")  # 16 chunks of 0.2 s: 3.2 s in all
    r = httpx.post(f"{server.base_url}/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=120)
    done["completion"] = time.monotonic()
    assert r.status_code == 200
    thread.join()
    assert done["completion"] < done["embedding"]  # before: it waited for all 64 prompts
    assert slow_embed == [4] * 16


def test_a_client_that_leaves_stops_its_embedding(server, slow_embed):
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.base_url}/embeddings", json={"input": _prompts(64, 20)}, timeout=0.5)
    wait_for(lambda: slow_embed, "the embedding to start")
    count = -1
    while count != len(slow_embed):  # until no new chunk comes for a while
        count = len(slow_embed)
        time.sleep(0.6)
    assert sum(slow_embed) < 64 / 2  # before: all 64 prompts, in one call
    r = httpx.post(f"{server.base_url}/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200


def test_the_caps_are_server_flags(checkpoint):
    """The review's open point: OpenAI's caps refused batch jobs vLLM takes; an operator can now
    raise them (or lower them), for /v1/embeddings, /score and /rerank alike."""
    import argparse

    from folio.entrypoints.openai.cli_args import ServerConfig, make_arg_parser
    from folio.entrypoints.openai.frontend_args import FrontendConfig
    from tests.server.harness import ServerThread, make_engine

    args = make_arg_parser(argparse.ArgumentParser()).parse_args(
        ["--max-embedding-inputs", "3", "--max-embedding-tokens", "300"])
    frontend = FrontendConfig.from_cli_args(args)
    assert (frontend.max_embedding_inputs, frontend.max_embedding_tokens) == (3, 300)
    with pytest.raises(ValueError, match="--max-embedding-inputs must be at least 1"):
        FrontendConfig(max_embedding_inputs=0)
    with ServerThread(make_engine(checkpoint), ServerConfig(frontend=frontend)) as server:
        url = server.base_url
        assert httpx.post(f"{url}/embeddings", json={"input": [[5]] * 3}, timeout=60).status_code == 200
        error = api_error(httpx.post(f"{url}/embeddings", json={"input": [[5]] * 4}, timeout=60), 400)
        assert error["param"] == "input" and "at most 3" in error["message"] and "--max-embedding-inputs" in error["message"]
        error = api_error(httpx.post(f"{url}/rerank", json={"query": "q", "documents": ["d"] * 4}, timeout=60), 400)
        assert error["param"] == "documents" and "at most 3" in error["message"]
        assert httpx.post(f"{url}/embeddings", json={"input": [[5] * 250]}, timeout=60).status_code == 200
        error = api_error(httpx.post(f"{url}/embeddings", json={"input": [[5] * 250] * 2}, timeout=60), 400)
        assert "at most 300" in error["message"] and "--max-embedding-tokens" in error["message"]
    raised = FrontendConfig(max_embedding_inputs=5000)
    with ServerThread(make_engine(checkpoint), ServerConfig(frontend=raised)) as server:
        response = httpx.post(f"{server.base_url}/embeddings", json={"input": [[5]] * 2049}, timeout=120)
        assert response.status_code == 200 and len(response.json()["data"]) == 2049  # past OpenAI's 2048
