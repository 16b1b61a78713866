"""What outlives --shutdown-timeout after SIGTERM ends in order: each stream with a last chunk
(finish_reason "abort") and [DONE], a whole response with a 503, and no crash in the log.

Before, uvicorn cancelled the handlers at the deadline: every stream was cut mid-way (no final
chunk, no [DONE]) and the log held one "Exception in ASGI application" per request.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import httpx
import pytest

from folio.engine.async_llm import RequestStream
from folio.entrypoints.openai.streaming import EventStreamResponse, LiveStreams
from folio.outputs import CompletionOutput, RequestOutput
from tests.server.harness import HANG_LIMIT_S
from tests.server.test_lifecycle import ServerProcess

LONG = {"max_tokens": 240, "ignore_eos": True, "temperature": 0}


def _events(lines: list[str]) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]


async def _stream(url: str, path: str, body: dict, started: asyncio.Event, client: httpx.AsyncClient) -> list[str]:
    lines = []
    async with client.stream("POST", f"{url}/v1/{path}", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line:
                lines.append(line)
                started.set()
    return lines


async def _run_clients(server: ServerProcess) -> tuple[list[tuple[str, list[str]]], httpx.Response]:
    """Streams (completions with include_usage, n 1 or 2; chat) and one whole response; SIGTERM
    once every stream has its first event."""
    bodies = [("completions", {"prompt": f"Story {i}", "n": 1 + i % 2, **LONG,
                               "stream_options": {"include_usage": True}}) for i in range(24)]
    bodies += [("chat/completions", {"messages": [{"role": "user", "content": f"Hi {i}"}], **LONG}) for i in range(4)]
    async with httpx.AsyncClient(timeout=HANG_LIMIT_S, limits=httpx.Limits(max_connections=64)) as client:
        started = [asyncio.Event() for _ in bodies]
        streams = [asyncio.ensure_future(_stream(server.url, path, body, event, client))
                   for (path, body), event in zip(bodies, started)]
        whole = asyncio.ensure_future(client.post(f"{server.url}/v1/completions", json={"prompt": "Hi", **LONG}))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), HANG_LIMIT_S)
        server.proc.send_signal(signal.SIGTERM)
        done = await asyncio.gather(*streams)
        return [(path, lines) for (path, _), lines in zip(bodies, done)], await whole


@pytest.mark.slow
@pytest.mark.parametrize("engine_process", [False, True])
def test_what_outlives_the_shutdown_timeout_ends_in_order(checkpoint, engine_process):
    server = ServerProcess([sys.executable, "-m", "folio.entrypoints.openai.api_server", "--model", checkpoint,
                            "--port", "0", "--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                            "--shutdown-timeout", "0.3", "--disable-uvicorn-access-log",
                            "--engine-process" if engine_process else "--no-engine-process"])
    try:
        streams, whole = asyncio.run(_run_clients(server))
        assert server.proc.wait(HANG_LIMIT_S) == 0, "".join(server.lines)
    finally:
        server.stop()
    for path, lines in streams:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        events = _events(lines)
        ends = {c["index"]: c["finish_reason"] for e in events for c in e.get("choices", []) if c["finish_reason"]}
        n = max(c["index"] for e in events for c in e.get("choices", [])) + 1
        assert sorted(ends) == list(range(n)) and set(ends.values()) <= {"abort", "length"}, lines[-4:]
        assert "abort" in ends.values(), lines[-4:]  # 240 tokens do not fit in 0.3 s on a CPU
        if path == "completions":  # include_usage: the usage chunk still comes, after the ends
            assert events[-1]["choices"] == [] and events[-1]["usage"]["prompt_tokens"] > 0, events[-1]
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "engine_unavailable", whole.text
    log = "".join(server.lines)
    for crash in ("Traceback", "Exception in ASGI", "graceful shutdown exceeded", "ERROR"):
        assert crash not in log, log


def _output(index: int, text: str, finish: str | None = None, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", None, [1, 2, 3], None, [CompletionOutput(index, text, [7], None, None, finish)],
                         finished, num_cached_tokens=2)


def test_ending_a_stream_closes_only_the_choices_still_open():
    """n=2 with choice 0 finished: the last output closes choice 1 alone, and keeps the prompt's
    token count for the usage chunk; outputs queued before the response was built count too."""
    aborted: list[str] = []

    async def main():
        stream = RequestStream("r", aborted.append)
        stream.put(_output(0, "a", finish="length"))  # queued before the response existed
        response = EventStreamResponse(_nothing(), [stream], [2])
        stream.put(_output(1, "b"))
        live = LiveStreams({response})
        assert live.end_all() == 1
        return [o async for o in stream]

    (merged,) = asyncio.run(main())
    assert aborted == ["r"] and merged.finished
    assert [(c.index, c.text, c.finish_reason) for c in merged.outputs] == [(0, "a", "length"), (1, "b", "abort")]
    assert merged.prompt_token_ids == [1, 2, 3] and merged.num_cached_tokens == 2


def test_a_finished_stream_is_left_alone():
    aborted: list[str] = []

    async def main():
        stream = RequestStream("r", aborted.append)
        response = EventStreamResponse(_nothing(), [stream], [1])
        stream.put(_output(0, "a", finish="stop", finished=True))
        response.end_with_abort()
        return [o async for o in stream]

    (only,) = asyncio.run(main())
    assert aborted == [] and only.outputs[0].finish_reason == "stop"


async def _nothing():
    return
    yield
