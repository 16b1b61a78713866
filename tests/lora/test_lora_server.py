"""LoRA adapters served through the OpenAI API, driven by the official openai client.

The request's `model` picks the adapter; answers equal transformers + PeftModel's greedy tokens
(decoded with the same tokenizer); /v1/models lists adapters with their base as `parent`;
adapters load and unload at run time behind --allow-runtime-lora-updating; errors are 400/404.
"""

from __future__ import annotations

import argparse

import httpx
import openai
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from folio.entrypoints.openai.api_server import build_app
from folio.entrypoints.openai.cli_args import LoRAModulePath, ServerConfig, parse_lora_module
from tests.helpers.adapters import make_peft_adapter, peft_greedy
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer
from tests.server.harness import ServerThread, make_engine

pytestmark = pytest.mark.slow
MAX_NEW = 8
PROMPT = "Once upon a time there was"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    base = make_tiny_checkpoint("llama", root / "base")
    save_test_tokenizer(base)
    small = make_peft_adapter(base, root / "small", seed=1, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    wide = make_peft_adapter(base, root / "wide", seed=2, r=8, lora_alpha=16)
    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = tokenizer.encode(PROMPT)
    texts = {name: tokenizer.decode(peft_greedy(base, path, [ids], MAX_NEW)[0])
             for name, path in (("base", None), ("small", small), ("wide", wide))}
    return base, small, wide, texts


@pytest.fixture(scope="module")
def server(case):
    base, small, _, _ = case
    config = ServerConfig(lora_modules=(LoRAModulePath("small", small),), allow_runtime_lora_updating=True)
    engine = make_engine(base, enable_lora=True, max_loras=2, max_lora_rank=8)
    with ServerThread(engine, config) as running:
        yield running


@pytest.fixture
def client(server):
    with OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _complete(client, model: str) -> openai.types.Completion:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_NEW, temperature=0,
                                     extra_body={"ignore_eos": True})


def test_models_lists_adapters_with_their_parent(client, server):
    base_name = server.engine.model_config.served_model_name
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) >= {base_name, "small"}
    assert cards["small"].parent == base_name and cards[base_name].parent is None
    assert client.models.retrieve("small").id == "small"


def test_the_model_field_picks_the_adapter(client, server, case):
    texts = case[3]
    assert texts["small"] != texts["base"]
    out = _complete(client, "small")
    assert out.choices[0].text == texts["small"] and out.model == "small"
    base_name = server.engine.model_config.served_model_name
    assert _complete(client, base_name).choices[0].text == texts["base"]
    chat = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.model == "small"


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="'nope' does not exist"):
        _complete(client, "nope")


def test_load_serve_and_unload_at_run_time(client, server, case):
    _, _, wide, texts = case
    post = lambda path, body: httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)  # noqa: E731
    response = post("load_lora_adapter", {"lora_name": "wide", "lora_path": wide})
    assert response.status_code == 200, response.text
    assert _complete(client, "wide").choices[0].text == texts["wide"]
    assert post("load_lora_adapter", {"lora_name": "wide", "lora_path": wide}).status_code == 400
    _, small, _, _ = case
    assert post("load_lora_adapter", {"lora_name": "wide", "lora_path": small, "load_inplace": True}).status_code == 200
    assert _complete(client, "wide").choices[0].text == texts["small"], "the name now serves the new adapter"
    missing = post("load_lora_adapter", {"lora_name": "gone", "lora_path": wide + "-missing"})
    assert missing.status_code == 400 and "does not exist" in missing.json()["error"]["message"]
    assert post("unload_lora_adapter", {"lora_name": "wide"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        _complete(client, "wide")
    assert post("unload_lora_adapter", {"lora_name": "wide"}).status_code == 404
    assert "gone" not in {m.id for m in client.models.list().data}


def test_metrics_report_adapters(client, server):
    _complete(client, "small")
    text = httpx.get(f"{server.url}/metrics").text
    assert 'vllm:lora_requests_info{max_lora="2"' in text


def test_runtime_updating_is_off_by_default(case):
    base, small, _, _ = case
    engine = make_engine(base, enable_lora=True, max_loras=1, max_lora_rank=8)
    with ServerThread(engine, ServerConfig()) as running:
        response = httpx.post(f"{running.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": small})
        assert response.status_code == 404 and "--allow-runtime-lora-updating" in response.text


def test_lora_modules_flag_forms():
    assert parse_lora_module("a=/p") == LoRAModulePath("a", "/p")
    assert parse_lora_module('{"name": "a", "path": "/p", "base_model_name": "b"}') == LoRAModulePath("a", "/p", "b")
    for bad in ("a", "=/p", '{"name": 1}', "{oops"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_lora_module(bad)


def test_engine_in_its_own_process_serves_adapters(case):
    """Adapters and LoRA commands cross the pipe to an engine process (pickled) the same way."""
    base, small, wide, texts = case
    config = ServerConfig(lora_modules=(LoRAModulePath("small", small),), allow_runtime_lora_updating=True)
    engine = make_engine(base, enable_lora=True, max_loras=1, max_lora_rank=8, engine_process=True)
    with ServerThread(engine, config) as running, OpenAI(base_url=running.base_url, api_key="unused", max_retries=0) as api:
        assert _complete(api, "small").choices[0].text == texts["small"]
        response = httpx.post(f"{running.url}/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": wide}, timeout=60)
        assert response.status_code == 200, response.text
        assert _complete(api, "wide").choices[0].text == texts["wide"]


def test_lora_modules_need_enable_lora(case):
    base, small, _, _ = case
    with pytest.raises(ValueError, match="--enable-lora"):
        build_app(make_engine(base), ServerConfig(lora_modules=(LoRAModulePath("small", small),)))


def test_lora_metrics_count_requests_per_adapter():
    from prometheus_client import CollectorRegistry, generate_latest

    from folio.engine.engine_stats import EngineStats
    from folio.engine.lora_metrics import LoRAMetrics

    registry = CollectorRegistry()
    metrics = LoRAMetrics(registry, {"model_name": "m"})
    stats = EngineStats(num_running=3, num_waiting=1, num_blocks=8, num_free_blocks=8, kv_cache_usage=0.0,
                        num_preemptions=0, lora_running=(("a", 2), ("b", 1)), lora_waiting=(("c", 1),), max_loras=2)
    metrics.record(stats)
    text = generate_latest(registry).decode()
    assert 'max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"' in text
    assert 'folio:lora_requests{lora_name="a",model_name="m",state="running"} 2.0' in text
    metrics.record(EngineStats(0, 0, 8, 8, 0.0, 0, max_loras=2))
    text = generate_latest(registry).decode()
    assert 'running_lora_adapters=""' in text and 'lora_name="a"' not in text
