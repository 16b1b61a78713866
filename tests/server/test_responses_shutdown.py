"""A /v1/responses answer cut short by a shutdown past --shutdown-timeout is "incomplete".

The shutdown ends every stream still going with finish_reason "abort" (LiveStreams.end_all): a
chat or completions stream reports that reason; a Responses stream used to end with
response.completed and status "completed", as if the answer were whole.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from folio.entrypoints.openai.protocol.responses import ResponsesResponse
from folio.entrypoints.openai.serving_responses import _finish
from folio.outputs import CompletionOutput, RequestOutput
from tests.server.harness import HANG_LIMIT_S

OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def _events(lines) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


def _end_all_streams(server) -> int:
    """What FolioServer's drain does at --shutdown-timeout, on the server's event loop."""
    async def end_all() -> int:
        return server.app.state.live_streams.end_all()

    return asyncio.run_coroutine_threadsafe(end_all(), server.engine._loop).result(HANG_LIMIT_S)


class StepGate:
    """Let the engine take `steps` steps, then stop it at the next one until the test ends."""

    def __init__(self, engine, steps: int) -> None:
        self.engine, self.steps = engine, steps
        self.stopped, self.release = threading.Event(), threading.Event()
        self._step = engine.step

    def step(self):
        if self.steps == 0:
            self.stopped.set()
            self.release.wait()
        self.steps = max(0, self.steps - 1)
        return self._step()

    def __enter__(self) -> StepGate:
        self.engine.step = self.step
        return self

    def __exit__(self, *exc_info) -> None:
        self.release.set()
        del self.engine.step  # back to the class's method


@pytest.mark.parametrize("steps", [0, 3])
def test_a_stream_cut_by_shutdown_ends_incomplete(server, model_name, steps):
    body = {"model": model_name, "input": "Tell me a long story.", "max_output_tokens": 200, "temperature": 0,
            "stream": True}
    # The request is in flight, and cannot finish, when the shutdown ends it.
    with StepGate(server.engine.engine, steps) as gate:
        with httpx.stream("POST", f"{server.base_url}/responses", json=body, timeout=HANG_LIMIT_S) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert gate.stopped.wait(HANG_LIMIT_S)
            assert _end_all_streams(server) == 1
            events = _events(list(lines))
    types = [e["type"] for e in events]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert types == OPENING + ["response.output_text.delta"] * len(deltas) + CLOSING + ["response.incomplete"], types
    final = events[-1]["response"]  # was response.completed, status "completed"
    assert final["status"] == "incomplete" and final["output"][0]["status"] == "incomplete", final
    assert final["incomplete_details"] is None, final  # none of OpenAI's reasons is a shutdown
    assert final["output"][0]["content"][0]["text"] == "".join(deltas) == events[-4]["text"]
    assert (final["usage"]["output_tokens"] > 0) == (steps > 0), final["usage"]
    ResponsesResponse.model_validate(final)


def _shell() -> ResponsesResponse:
    return ResponsesResponse(id="resp_1", created_at=0, status="in_progress", model="m", output=[])


def _whole(text: str, finish_reason: str) -> RequestOutput:
    return RequestOutput("resp_1", None, [1, 2, 3], None,
                         [CompletionOutput(0, text, [7, 8], None, None, finish_reason)], True)


def test_a_whole_response_that_was_aborted_is_incomplete_and_keeps_its_text():
    response = _finish(_shell(), _whole("Once upon", "abort"))
    assert response.status == "incomplete" and response.output[0].status == "incomplete"
    assert response.output[0].content[0].text == "Once upon" and response.incomplete_details is None
    assert response.usage.output_tokens == 2 and response.usage.input_tokens == 3


def test_other_finish_reasons_keep_their_status():
    cut = _finish(_shell(), _whole("a", "length"))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    done = _finish(_shell(), _whole("a", "stop"))
    assert done.status == "completed" and done.output[0].status == "completed" and done.incomplete_details is None
