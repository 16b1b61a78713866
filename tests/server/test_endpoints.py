"""Every endpoint through the official openai client (or plain HTTP where it has no method)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI

from folio import LLM, SamplingParams
from folio.version import __version__
from tests.server.conftest import API_KEY
from tests.server.harness import wait_for

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, my name is", "The capital of France is", "Once upon a time"]


def test_models_list_and_retrieve(client, model_name, server):
    (card,) = client.models.list().data
    assert card.id == model_name and card.object == "model" and card.owned_by == "folio"
    assert card.model_extra["max_model_len"] == 256
    assert client.models.retrieve(model_name).id == model_name


def test_health_version_metrics(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/version").json() == {"version": __version__}
    metrics = httpx.get(f"{server.url}/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    for name in ("folio:num_requests_running", "folio:num_requests_waiting", "folio:kv_cache_usage_perc",
                 "folio:num_preemptions_total", "folio:prompt_tokens_total", "folio:generation_tokens_total",
                 "folio:time_to_first_token_seconds_bucket", "folio:time_per_output_token_seconds_bucket",
                 "folio:e2e_request_latency_seconds_bucket"):
        assert name in metrics.text


def _metric(server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_metrics_count_tokens_and_latencies(client, model_name, server):
    before = {n: _metric(server, n) for n in (
        "folio:prompt_tokens_total", "folio:generation_tokens_total", "folio:e2e_request_latency_seconds_count",
        "folio:time_to_first_token_seconds_count")}
    r = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert _metric(server, "folio:generation_tokens_total") - before["folio:generation_tokens_total"] == 7
    assert _metric(server, "folio:prompt_tokens_total") - before["folio:prompt_tokens_total"] == r.usage.prompt_tokens
    assert _metric(server, "folio:e2e_request_latency_seconds_count") == before["folio:e2e_request_latency_seconds_count"] + 1
    assert _metric(server, "folio:time_to_first_token_seconds_count") == before["folio:time_to_first_token_seconds_count"] + 1


def test_completion_shape_and_usage(client, model_name, server):
    r = client.completions.create(model=model_name, prompt=PROMPTS[1], max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == model_name
    (choice,) = r.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.logprobs is None
    tokenizer = server.engine.tokenizer
    assert r.usage.prompt_tokens == len(tokenizer.encode(PROMPTS[1]))
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_server_text_equals_offline_generate(client, model_name, checkpoint):
    llm = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=256, seed=0)
    offline = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    r = client.completions.create(model=model_name, prompt=PROMPTS, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [o.outputs[0].text for o in offline]
    tokens = [{"prompt_token_ids": o.prompt_token_ids} for o in offline]
    by_ids = client.completions.create(model=model_name, prompt=[t["prompt_token_ids"] for t in tokens],
                                       max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in by_ids.choices] == [o.outputs[0].text for o in offline]
    chat_offline = llm.chat([{"role": "user", "content": "Hi there"}],
                            SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi there"}],
                                          max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == chat_offline[0].outputs[0].text
    assert chat.choices[0].message.role == "assistant" and chat.object == "chat.completion"


def test_max_completion_tokens_and_default_max_tokens(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                       max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    r = client.completions.create(model=model_name, prompt="Hi", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16  # OpenAI's default for completions


def test_unknown_request_fields_are_ignored(client, model_name):
    r = client.completions.create(model=model_name, prompt="Hi", max_tokens=2,
                                  extra_body={"no_such_field": [1, 2], "another": {"x": 1}})
    assert len(r.choices) == 1


def test_model_field_may_be_left_out(server):
    r = httpx.post(f"{server.base_url}/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"]


def test_tokenize_and_detokenize(server):
    tokenizer = server.engine.tokenizer
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello there", "return_token_strs": True}).json()
    assert r["tokens"] == tokenizer.encode("Hello there") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 256 and "".join(r["token_strs"]) == "Hello there"
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": r["tokens"]}).json()
    assert back == {"prompt": "Hello there"}


def test_async_client_completion_and_chat(server, model_name):
    async def main():
        async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as client:
            completion = await client.completions.create(model=model_name, prompt="Hi", max_tokens=4, temperature=0)
            stream = await client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, stream=True)
            pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
            return completion, "".join(pieces)

    completion, streamed = asyncio.run(main())
    assert completion.choices[0].text
    assert isinstance(streamed, str)


def test_openapi_schema_documents_400_not_422(server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    paths = schema["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/version",
                 "/metrics", "/tokenize", "/detokenize"):
        assert path in paths
    for path, operations in paths.items():
        for operation in operations.values():
            assert "422" not in operation["responses"], path
    post = paths["/v1/chat/completions"]["post"]
    assert {"400", "404", "503"} <= set(post["responses"])
    assert "text/event-stream" in post["responses"]["200"]["content"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_use_beam_search_equals_offline_beam_search(client, model_name, checkpoint):
    from folio import BeamSearchParams

    llm = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=256, seed=0)
    tokenizer = llm.get_tokenizer()
    (offline,) = llm.beam_search([PROMPTS[0]], BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))
    prompt_len = len(tokenizer.encode(PROMPTS[0]))
    want = [tokenizer.decode(seq.tokens[prompt_len:]) for seq in offline.sequences]
    r = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=6, n=3,
                                  extra_body={"use_beam_search": True, "ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2] and [c.text for c in r.choices] == want
    assert r.usage.completion_tokens == 18
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, n=2, extra_body={"use_beam_search": True})
    assert len(chat.choices) == 2
    neutral = {"top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "stop": [], "logit_bias": {}, "seed": 3}
    r = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=6, n=3,
                                  extra_body={"use_beam_search": True, "ignore_eos": True, **neutral})
    assert [c.text for c in r.choices] == want
    for extra, param in (({"stop": ["x"]}, "stop"), ({"top_k": 5}, "top_k"), ({"length_penalty": 1000.0}, "length_penalty"),
                         ({"length_penalty": -1e9}, "length_penalty")):
        r = httpx.post(f"{client.base_url}completions", headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"prompt": "Hi", "n": 2, "use_beam_search": True, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    r = httpx.post(f"{client.base_url}completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"prompt": "Hi", "n": 2, "use_beam_search": True, "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    stream = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=6, n=3, stream=True,
                                       extra_body={"use_beam_search": True, "ignore_eos": True})
    texts = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(3)] == want


def test_metrics_count_prefix_cache_hits(client, model_name, server):
    before = {n: _metric(server, n) for n in ("folio:prefix_cache_queries_total", "folio:prefix_cache_hits_total")}
    prompt = [(7 * i) % 200 + 5 for i in range(40)]  # 40 tokens: two full blocks of 16 are cacheable
    for _ in range(2):
        r = client.completions.create(model=model_name, prompt=prompt, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens == 32

    def grew() -> bool:
        return _metric(server, "folio:prefix_cache_hits_total") - before["folio:prefix_cache_hits_total"] >= 32

    wait_for(grew, "the prefix cache hits to reach /metrics")
    assert _metric(server, "folio:prefix_cache_queries_total") - before["folio:prefix_cache_queries_total"] >= 80
    assert "folio:kv_blocks_swapped_out_total" in httpx.get(f"{server.url}/metrics").text


def test_cache_salt_keeps_cached_prompts_apart(client, model_name):
    prompt = [(11 * i) % 200 + 5 for i in range(40)]

    def cached(salt: str) -> int:
        r = client.completions.create(model=model_name, prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt})
        return r.usage.prompt_tokens_details.cached_tokens

    assert [cached("salt-one"), cached("salt-one"), cached("salt-two")] == [0, 32, 0]
    r = httpx.post(f"{client.base_url}completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"prompt": "Hi", "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
