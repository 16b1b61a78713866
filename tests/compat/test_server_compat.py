"""The server's vLLM surface: request fields (logged, refused, vLLM extras), vllm: metrics,
/ping and /version without the key, CORS, request logs, --disable-fastapi-docs."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from folio import LLM, SamplingParams
from folio.entrypoints.openai.cli_args import ServerConfig
from folio.entrypoints.openai.frontend_args import FrontendConfig
from tests.server.harness import ServerThread, make_engine

KEY = "sk-compat"


@pytest.fixture(scope="module")
def server(tiny_model):
    frontend = FrontendConfig(allowed_origins=("http://allowed.example",), enable_log_requests=True, max_log_len=5)
    with ServerThread(make_engine(tiny_model), ServerConfig(api_key=KEY, frontend=frontend)) as running:
        yield running


@pytest.fixture(scope="module")
def offline(tiny_model) -> LLM:
    return LLM(model=tiny_model, dtype="float32", device="cpu", max_model_len=256)


@pytest.fixture
def captured():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("folio")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"})


def test_unknown_fields_are_logged_not_refused(server, captured):
    r = _post(server, "/completions", {"prompt": "Hi", "max_tokens": 2, "brand_new_field": 1, "other": "x"})
    assert r.status_code == 200
    messages = [rec.getMessage() for rec in captured]
    assert any("fields were present in the request but ignored: ['brand_new_field', 'other']" in m for m in messages)


def test_unknown_nested_fields_are_logged_with_where_they_were(server, captured):
    # A review found fields inside response_format and tools dropped without a log line.
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "foo": 1}, "bar": 2}
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "tools": [tool], "tool_choice": "none",
            "response_format": {"type": "json_object", "extra_knob": True}}
    assert _post(server, "/chat/completions", body).status_code == 200
    messages = [rec.getMessage() for rec in captured]
    for where, field in (("ResponseFormat", "extra_knob"), ("ToolDefinition", "bar"), ("FunctionDefinition", "foo")):
        assert any(f"ignored: ['{field}'] (in {where})" in m for m in messages), (where, messages)


@pytest.mark.parametrize("field, value", [("audio", {"voice": "x"}), ("modalities", ["text", "audio"]),
                                          ("prediction", {"type": "content"}), ("store", True),
                                          ("functions", [{"name": "f"}])])
def test_openai_chat_fields_folio_cannot_honour_are_400s(server, field, value):
    r = _post(server, "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    ok = _post(server, "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                             "modalities": ["text"], "store": False, "metadata": {"a": "b"}})
    assert ok.status_code == 200


def test_vllm_sampling_extras_over_http_equal_offline(server, offline):
    body = {"prompt": "Hello, my name is", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "truncate_prompt_tokens": 3, "allowed_token_ids": [5, 6, 7, 8], "bad_words": ["zzz"]}
    got = _post(server, "/completions", body).json()["choices"][0]["text"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, truncate_prompt_tokens=3,
                            allowed_token_ids=[5, 6, 7, 8], bad_words=["zzz"])
    (want,) = offline.generate("Hello, my name is", params, use_tqdm=False)
    assert got == want.outputs[0].text
    assert _post(server, "/completions", {"prompt": "Hi", "truncate_prompt_tokens": 10**6}).status_code == 400
    r = _post(server, "/completions", {"prompt": "Hi", "allowed_token_ids": [10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids"


def test_vllm_metrics_beside_folios(server):
    assert _post(server, "/completions", {"prompt": "count me", "max_tokens": 5, "ignore_eos": True}).status_code == 200
    streamed = _post(server, "/completions", {"prompt": "stream me", "max_tokens": 6, "ignore_eos": True, "stream": True})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text  # a DELTA request: gaps step by step
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:request_success_total"):
        assert re.search(rf'^{name}{{[^}}]*engine="0"[^}}]*model_name="[^"]+"', text, re.M), name
    def value(name):
        return float(re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M).group(1))
    assert value("vllm:generation_tokens_total") == value("folio:generation_tokens_total") >= 5
    assert value("vllm:prompt_tokens_total") == value("folio:prompt_tokens_total") > 0
    # every generated token after a request's first has one inter-token gap
    requests = value("vllm:e2e_request_latency_seconds_count")
    assert value("vllm:inter_token_latency_seconds_count") == value("vllm:generation_tokens_total") - requests
    assert value("vllm:request_generation_tokens_sum") == value("vllm:generation_tokens_total")
    assert value("vllm:request_prompt_tokens_sum") == value("vllm:prompt_tokens_total")
    assert value("vllm:request_prompt_tokens_count") == requests


def test_metrics_compat_none_hides_vllm_names(tiny_model):
    config = ServerConfig(frontend=FrontendConfig(metrics_compat="none", disable_fastapi_docs=True))
    with ServerThread(make_engine(tiny_model), config) as other:
        text = httpx.get(f"{other.url}/metrics").text
        assert "folio:num_requests_running" in text and "vllm:" not in text
        assert httpx.get(f"{other.url}/docs").status_code == 404
        assert httpx.get(f"{other.url}/openapi.json").status_code == 404


def test_ping_and_version_are_open_the_api_is_not(server):
    assert httpx.get(f"{server.url}/ping").status_code == 200
    assert httpx.post(f"{server.url}/ping").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/version").status_code == 200
    assert httpx.get(f"{server.base_url}/models").status_code == 401


def test_cors_follows_allowed_origins(server):
    preflight = {"Access-Control-Request-Method": "POST"}
    ok = httpx.options(f"{server.base_url}/completions", headers={"Origin": "http://allowed.example", **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://allowed.example"
    other = httpx.options(f"{server.base_url}/completions", headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers


def test_request_log_cut_to_max_log_len(server, captured):
    assert _post(server, "/completions", {"prompt": "abcdefghijkl", "max_tokens": 1}).status_code == 200
    lines = [rec.getMessage() for rec in captured if "Received request" in rec.getMessage()]
    assert lines and "prompt: 'abcde'," in lines[-1]


def test_frontend_config_refuses_bad_values(tmp_path):
    with pytest.raises(ValueError, match="ssl"):
        FrontendConfig(ssl_keyfile=str(tmp_path / "missing.key"), ssl_certfile=str(tmp_path / "missing.crt"))
    with pytest.raises(ValueError, match="ssl-certfile"):
        FrontendConfig(ssl_keyfile="x")
    with pytest.raises(ValueError, match="metrics-compat"):
        FrontendConfig(metrics_compat="prometheus")


def test_fields_that_were_accepted_and_dropped_are_400s_now(server):
    """Session 27's review: length_penalty without beam search and store=true on /v1/responses were
    accepted and did nothing; a client that sets them gets a 400 naming the field."""
    r = _post(server, "/completions", {"prompt": "Hi", "max_tokens": 2, "length_penalty": 2.0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "length_penalty"
    assert "use_beam_search" in r.json()["error"]["message"]
    ok = _post(server, "/completions", {"prompt": "Hi", "max_tokens": 2, "length_penalty": 1.0})
    assert ok.status_code == 200
    r = _post(server, "/responses", {"input": "Hi", "max_output_tokens": 2, "store": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "store"
    ok = _post(server, "/responses", {"input": "Hi", "max_output_tokens": 2, "store": False})
    assert ok.status_code == 200 and ok.json()["store"] is False
