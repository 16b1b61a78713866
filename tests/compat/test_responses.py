"""/v1/responses with the official openai client: text in, text out, streamed events."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from folio import LLM, SamplingParams
from tests.server.harness import ServerThread, make_engine


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerThread(make_engine(tiny_model)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with OpenAI(api_key="EMPTY", base_url=server.base_url, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def offline(tiny_model) -> LLM:
    return LLM(model=tiny_model, dtype="float32", device="cpu", max_model_len=256)


def _chat_greedy(offline: LLM, messages, max_tokens: int):
    (out,) = offline.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return out.outputs[0]


def test_responses_create_equals_chat(client, offline):
    model = client.models.list().data[0].id
    response = client.responses.create(model=model, input="Tell me a story.", instructions="Be brief.",
                                       temperature=0, max_output_tokens=12)
    want = _chat_greedy(offline, [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Tell me a story."}], 12)
    assert response.output_text == want.text
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output[0].id == "msg_" + response.id.removeprefix("resp_")
    assert response.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert response.usage.output_tokens == len(want.token_ids)
    assert response.output[0].role == "assistant"


def test_responses_message_list_input(client, offline):
    items = [{"role": "developer", "content": "Answer in French."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}]
    response = client.responses.create(model=None, input=items, temperature=0, max_output_tokens=8)
    want = _chat_greedy(offline, [{"role": "system", "content": "Answer in French."},
                                  {"role": "user", "content": "Hello"}], 8)
    assert response.output_text == want.text


def test_responses_stream_events(client, offline):
    stream = client.responses.create(model=None, input="Hi there", temperature=0, max_output_tokens=10, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    want = _chat_greedy(offline, [{"role": "user", "content": "Hi there"}], 10)
    assert deltas == want.text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == len(want.token_ids)


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input[0].content"),
    ({"input": "x", "max_output_tokens": 100000}, "max_output_tokens"),
])
def test_responses_refuses_what_it_cannot_honour(server, body, param):
    r = httpx.post(f"{server.base_url}/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
