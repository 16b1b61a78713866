"""A streamed request the engine refuses after accepting it (a structured-output constraint that
compiles but admits no output) is answered like the same request unstreamed: a 400, not a 200
whose only event is an error. Found by a review: the refusal arrives once the grammar compiled,
after the add was answered, and the event stream's headers had already gone out."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from folio.engine.async_llm import EngineDeadError, RequestStream
from folio.entrypoints.openai.errors import BadRequestError, ServiceUnavailableError
from folio.entrypoints.openai.streaming import wait_started
from folio.outputs import CompletionOutput, RequestOutput
from folio.sampling_params import SamplingParamsError
from tests.server.harness import api_error, wait_for

# A schema that only refers to itself: it compiles, and no output can begin it.
RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
MESSAGES = [{"role": "user", "content": "hi"}]
REFUSED = [
    ("/completions", {"prompt": "hi", "max_tokens": 5, "guided_json": RECURSIVE}),
    ("/completions", {"prompt": ["hi", "ho"], "n": 2, "max_tokens": 5, "guided_json": RECURSIVE}),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 5,
                           "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": RECURSIVE}}}),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 5, "tool_choice": {"type": "function", "function": {
        "name": "f"}}, "tools": [{"type": "function", "function": {"name": "f", "parameters": RECURSIVE}}]}),
]


@pytest.mark.slow
@pytest.mark.parametrize("path, body", REFUSED)
def test_a_refused_stream_is_the_same_400_as_the_refused_whole_response(server, path, body):
    whole = api_error(httpx.post(f"{server.base_url}{path}", json=body, timeout=60), 400)
    streamed = api_error(httpx.post(f"{server.base_url}{path}", json={**body, "stream": True}, timeout=60), 400)
    # the same error but for the request id in its message
    assert _without_ids(streamed) == _without_ids(whole) and streamed["param"] == "structured_outputs"
    assert "admits no output" in streamed["message"]
    wait_for(lambda: server.engine.num_in_flight == 0, "the refused requests to be gone")


def _without_ids(error: dict) -> dict:
    return {**error, "message": re.sub(r"'(cmpl|chatcmpl)-[0-9a-f]+(-\d+)?'", "<id>", error["message"])}


@pytest.mark.slow
@pytest.mark.parametrize("path, body", [
    ("/completions", {"prompt": "hi", "max_tokens": 4, "guided_choice": ["alpha", "beta"]}),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "guided_regex": "[a-z]{3}"}),
])
def test_a_constrained_stream_that_is_accepted_streams_every_token(server, path, body):
    """The wait for the first output must not consume it: streamed text equals the whole text."""
    whole = httpx.post(f"{server.base_url}{path}", json={**body, "temperature": 0}, timeout=60)
    assert whole.status_code == 200, whole.text
    with httpx.stream("POST", f"{server.base_url}{path}", json={**body, "temperature": 0, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and '"error"' not in "".join(events)
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    if path == "/completions":
        streamed, expected = "".join(c["choices"][0]["text"] for c in chunks), whole.json()["choices"][0]["text"]
    else:
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        expected = whole.json()["choices"][0]["message"]["content"]
    assert streamed == expected and expected


# ---- wait_started, without a server -----------------------------------------------------------


def _output(text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", "p", [1], None, [CompletionOutput(0, text, [5], -1.0, None,
                                                                "stop" if finished else None)], finished)


def test_wait_started_keeps_the_first_output_and_maps_a_refusal_to_a_400():
    aborted: list[str] = []

    async def main():
        ok = RequestStream("ok", aborted.append)
        ok.put(_output("a"))
        await wait_started([ok])
        ok.put(_output("b", finished=True))
        assert [o.outputs[0].text async for o in ok] == ["ab"]  # nothing consumed, nothing lost
        refused, slow = RequestStream("refused", aborted.append), RequestStream("slow", aborted.append)
        waiting = asyncio.ensure_future(wait_started([slow, refused]))
        await asyncio.sleep(0)
        refused.put(SamplingParamsError("structured_outputs", "admits no output"))
        with pytest.raises(BadRequestError) as info:
            await waiting
        assert info.value.param == "structured_outputs" and refused.finished and slow.finished

        dead = RequestStream("dead", aborted.append)
        dead.put(EngineDeadError("stopped"))
        with pytest.raises(ServiceUnavailableError):  # what an add would get: a 503, not a 500
            await wait_started([dead])

    asyncio.run(main())
    assert aborted == ["slow"]  # the refused one is already gone from the engine


def test_wait_started_aborts_every_stream_when_cancelled():
    aborted: list[str] = []

    async def main():
        streams = [RequestStream(f"r{i}", aborted.append) for i in range(2)]
        streams[0].put(_output("a"))
        waiting = asyncio.ensure_future(wait_started(streams))
        await asyncio.sleep(0)
        waiting.cancel()  # what cancel_on_disconnect does when the client leaves
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    assert sorted(aborted) == ["r0", "r1"]


@pytest.mark.slow
def test_a_refused_responses_stream_is_a_400(server, monkeypatch):
    """/v1/responses takes no constraint yet (text.format is text only); one that its params
    carry, as a JSON text.format would, is awaited like the others'."""
    from folio.entrypoints.openai.serving_responses import OpenAIServingResponses
    from folio.sampling_params import StructuredOutputsParams

    params = OpenAIServingResponses._params

    def constrained(self, request, max_tokens):
        p = params(self, request, max_tokens)
        p.structured_outputs = StructuredOutputsParams(json=RECURSIVE)
        return p

    monkeypatch.setattr(OpenAIServingResponses, "_params", constrained)
    body = {"input": "hi", "max_output_tokens": 5, "stream": True}
    error = api_error(httpx.post(f"{server.base_url}/responses", json=body, timeout=60), 400)
    assert error["param"] == "structured_outputs" and "admits no output" in error["message"]
    monkeypatch.undo()
    with httpx.stream("POST", f"{server.base_url}/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert "event: response.completed" in text or "event: response.incomplete" in text  # unconstrained: served
    wait_for(lambda: server.engine.num_in_flight == 0, "the refused request to be gone")
