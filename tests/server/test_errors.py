"""Every error class leaves in OpenAI's shape: 400 (never 422) naming the field, 401, 404, 500, 503."""

from __future__ import annotations

import json
import os
import shutil
import threading

import httpx
import openai
import pytest
from openai import OpenAI

from folio.entrypoints.openai.cli_args import ServerConfig
from tests.server.harness import HeldEngine, ServerThread, api_error as _error, make_engine, wait_for

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("fields, param", [
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 2}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"presence_penalty": 5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 2}, "min_p"),
    ({"seed": 2**70}, "seed"),
    ({"seed": "x"}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 500}}, "logit_bias"),
    ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ({"logprobs": 1000}, "logprobs"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1, 2], [10**6]]}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": {"text": "hi"}}, "prompt"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"suffix": "end"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"stream": "yes please"}, "stream"),
    ({"logprobs": False}, "logprobs"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"prompt": [True, False]}, "prompt"),
    ({"logit_bias": {"1_0": 1}}, "logit_bias"),  # int() read it as token 10
    ({"use_beam_search": True, "n": 128}, "n"),  # 384 log-probs a token, past max_logprobs (was param null)
])
def test_invalid_completion_fields_are_400_naming_the_field(server, fields, param):
    body = {"prompt": "Hello", "max_tokens": 4, **fields}
    error = _error(httpx.post(f"{server.base_url}/completions", json=body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("fields, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": "Hi"}, "messages"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_invalid_chat_fields_are_400_naming_the_field(server, fields, param):
    body = {"messages": MESSAGES, "max_tokens": 4, **fields}
    error = _error(httpx.post(f"{server.base_url}/chat/completions", json=body), 400)
    if param is not None:
        assert error["param"] == param


def test_continue_final_message_is_accepted(server):
    body = {"messages": [*MESSAGES, {"role": "assistant", "content": "Once"}], "max_tokens": 2,
            "add_generation_prompt": False, "continue_final_message": True}
    assert httpx.post(f"{server.base_url}/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("content, content_type", [
    (b"{not json", "application/json"),
    (b'{"prompt": "Hi",}', "application/json"),
    (b"[1, 2]", "application/json"),
    (b"", "application/json"),
    (b"prompt=Hi", "application/x-www-form-urlencoded"),
])
def test_malformed_bodies_are_400(server, content, content_type):
    r = httpx.post(f"{server.base_url}/completions", content=content, headers={"content-type": content_type})
    _error(r, 400)


def test_malformed_json_says_so(server):
    r = httpx.post(f"{server.base_url}/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"})
    assert "JSON" in _error(r, 400)["message"]


def test_over_the_context_names_both_numbers(server, client, model_name):
    prompt_tokens = len(server.engine.tokenizer.encode("Hello there"))
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="Hello there", max_tokens=300)
    error = e.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "256" in error["message"] and str(prompt_tokens) in error["message"] and "300" in error["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=[list(range(5, 300))], max_tokens=1)
    assert e.value.body["param"] == "prompt" and "295" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=1000)
    assert e.value.body["param"] == "max_completion_tokens"


def test_unknown_model_is_404(server, client):
    for call in (
        lambda: client.completions.create(model="gpt-nope", prompt="Hi", max_tokens=1),
        lambda: client.chat.completions.create(model="gpt-nope", messages=MESSAGES, max_tokens=1),
        lambda: client.models.retrieve("gpt-nope"),
    ):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    _error(httpx.post(f"{server.url}/tokenize", json={"model": "gpt-nope", "prompt": "Hi"}), 404)


def test_unknown_route_and_method(server):
    _error(httpx.get(f"{server.base_url}/nothing-here"), 404)
    _error(httpx.get(f"{server.base_url}/completions"), 405)


# ---- a second server: an API key, and a model without a chat template --------------------------


@pytest.fixture(scope="module")
def keyed_server(checkpoint, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("no-template"))
    shutil.copytree(checkpoint, folder, dirs_exist_ok=True)
    os.remove(os.path.join(folder, "chat_template.jinja"))
    config_path = os.path.join(folder, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(config_path, "w") as f:
        json.dump(config, f)
    with ServerThread(make_engine(folder), ServerConfig(api_key="sk-right")) as running:
        yield running


def test_api_key_is_required_except_for_health_and_metrics(keyed_server):
    url = keyed_server.url
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-right"},
                    {"Authorization": "Bearer sk-right-but-longer"}):
        error = _error(httpx.get(f"{url}/v1/models", headers=headers), 401)
        assert error["code"] == "invalid_api_key"
        _error(httpx.post(f"{url}/v1/completions", json={"prompt": "Hi"}, headers=headers), 401)
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200
    with OpenAI(base_url=f"{url}/v1", api_key="sk-right", max_retries=0) as client:
        assert client.completions.create(model=client.models.list().data[0].id, prompt="Hi", max_tokens=2).choices
    with OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0) as client, pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_model_without_chat_template_is_a_clear_400(keyed_server):
    r = httpx.post(f"{keyed_server.url}/v1/chat/completions", json={"messages": MESSAGES},
                   headers={"Authorization": "Bearer sk-right"})
    error = _error(r, 400)
    assert "chat template" in error["message"] and "--chat-template" in error["message"]


def test_api_key_from_the_environment(monkeypatch):
    import argparse

    from folio.entrypoints.openai.cli_args import make_arg_parser

    monkeypatch.setenv("FOLIO_API_KEY", "sk-env")
    args = make_arg_parser(argparse.ArgumentParser()).parse_args([])
    assert ServerConfig.from_cli_args(args).api_key == "sk-env"
    args = make_arg_parser(argparse.ArgumentParser()).parse_args(["--api-key", "sk-flag"])
    assert ServerConfig.from_cli_args(args).api_key == "sk-flag"


# ---- 503: the waiting queue is full --------------------------------------------------------------


def test_full_waiting_queue_answers_503_with_retry_after(server):
    llm = server.engine
    # The first request waits in the scheduler (the held step has not scheduled it), the
    # second waits in the engine thread's command queue: two waiting, the limit.
    llm.max_waiting_requests, saved = 2, llm.max_waiting_requests
    results = {}

    def call(name):
        results[name] = httpx.post(f"{server.base_url}/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)

    try:
        with HeldEngine(llm.engine) as held:
            first = threading.Thread(target=call, args=("first",))
            first.start()
            held.entered.wait()  # first was accepted, the engine is (held) in its step
            wait_for(lambda: llm.stats().num_waiting == 1, "the first request to be accepted")
            second = threading.Thread(target=call, args=("second",))
            second.start()
            wait_for(lambda: llm._pending_sequences == 1, "the second request to be queued")
            third = httpx.post(f"{server.base_url}/completions", json={"prompt": "Hi", "max_tokens": 2})
            error = _error(third, 503)
            assert third.headers["Retry-After"] == "1" and error["code"] == "queue_full"
        first.join()
        second.join()
        assert results["first"].status_code == results["second"].status_code == 200
    finally:
        llm.max_waiting_requests = saved


def test_a_batch_is_added_all_or_none(server):
    llm = server.engine
    llm.max_waiting_requests, saved = 2, llm.max_waiting_requests
    try:
        # 4 sequences against a limit of 2 can never be queued: a 400 (session 27; a 503 said "retry
        # later"), and nothing of the batch is added (tests/server/test_queue_admission.py: the 503
        # for a batch larger than the room left adds nothing either)
        body = {"prompt": ["a", "b", "c", "d"], "max_tokens": 200, "ignore_eos": True}
        error = _error(httpx.post(f"{server.base_url}/completions", json=body), 400)
        assert error["param"] == "prompt" and "4 sequences" in error["message"]
    finally:
        llm.max_waiting_requests = saved
    wait_for(lambda: llm.num_in_flight == 0 and llm.stats().num_running + llm.stats().num_waiting == 0,
             "the accepted half of the batch to be withdrawn")
    stats = llm.stats()
    assert stats.num_free_blocks == stats.num_blocks


# ---- one request failing, and the engine failing ---------------------------------------------------


def test_a_failing_request_fails_alone(server, client, model_name):
    processor = server.engine.engine.output_processor
    original = processor._update_sample

    def update_sample(sample, out):
        if "<<boom>>" in sample.params.stop:
            raise RuntimeError("injected failure")
        return original(sample, out)

    processor._update_sample = update_sample
    try:
        bad = {"model": model_name, "prompt": "Hi", "max_tokens": 50, "stop": ["<<boom>>"]}
        error = _error(httpx.post(f"{server.base_url}/completions", json=bad), 500)
        assert "injected failure" in error["message"] and error["type"] == "server_error"
        with httpx.stream("POST", f"{server.base_url}/completions", json={**bad, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line]
        assert "injected failure" in json.loads(lines[-2][len("data: "):])["error"]["message"]
        assert lines[-1] == "data: [DONE]"
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model=model_name, messages=MESSAGES, stop=["<<boom>>"], stream=True))
    finally:
        del processor._update_sample
    assert client.completions.create(model=model_name, prompt="Hi", max_tokens=3).choices
    assert httpx.get(f"{server.url}/health").status_code == 200
    wait_for(lambda: server.engine.stats().num_running == 0, "the failed requests to be dropped")
    stats = server.engine.stats()
    assert stats.num_free_blocks == stats.num_blocks


def test_a_failing_handler_fails_alone(server, client, model_name, monkeypatch):
    from folio.entrypoints.openai.serving_chat import OpenAIServingChat

    def broken(self, call, output):
        raise KeyError("injected")

    monkeypatch.setattr(OpenAIServingChat, "_response", broken)
    error = _error(httpx.post(f"{server.base_url}/chat/completions", json={"messages": MESSAGES, "max_tokens": 3}), 500)
    assert "injected" in error["message"]
    monkeypatch.undo()
    assert client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3).choices


def test_a_dead_engine_fails_requests_and_health(checkpoint):
    with ServerThread(make_engine(checkpoint)) as dying:
        llm = dying.engine
        with HeldEngine(llm.engine) as held:
            with httpx.stream("POST", f"{dying.base_url}/completions",
                              json={"prompt": "Hi", "max_tokens": 50, "stream": True}, timeout=120) as r:
                held.entered.wait()
                llm.engine.step = _raise  # the held step returns into a broken engine
                held._step = _raise
                held.release.set()
                lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: "):])["error"]
        assert "engine" in error["message"] and "boom" in error["message"]
        health = _error(httpx.get(f"{dying.url}/health"), 503)
        assert "boom" in health["message"]
        _error(httpx.post(f"{dying.base_url}/completions", json={"prompt": "Hi", "max_tokens": 2}), 503)
        assert httpx.get(f"{dying.url}/metrics").status_code == 200


def _raise():
    raise RuntimeError("boom")


def test_a_model_without_a_tokenizer_serves_token_ids_only(tmp_path):
    from tests.helpers.checkpoints import make_tiny_checkpoint

    folder = make_tiny_checkpoint("llama", tmp_path / "bare")  # no tokenizer files
    with ServerThread(make_engine(folder)) as bare:
        url = bare.base_url
        r = httpx.post(f"{url}/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # Streamed, tokens are events although they have no text (clients time tokens by them;
        # deltas a slow reader missed arrive merged, so there may be fewer events than tokens).
        body = {"prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/completions", json=body) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        assert 1 < len(events) <= 64 and {e["choices"][0]["text"] for e in events} == {""}
        assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"
        for body, param in (({"prompt": "Hi"}, "prompt"), ({"prompt": [5, 6], "logprobs": 1}, "logprobs"),
                            ({"prompt": [5, 6], "echo": True}, "echo")):
            assert _error(httpx.post(f"{url}/completions", json=body), 400)["param"] == param
        _error(httpx.post(f"{url}/chat/completions", json={"messages": MESSAGES}), 400)
        _error(httpx.post(f"{bare.url}/tokenize", json={"prompt": "Hi"}), 400)
        _error(httpx.post(f"{bare.url}/detokenize", json={"tokens": [5]}), 400)
