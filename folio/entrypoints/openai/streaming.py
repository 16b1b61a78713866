"""Server-sent events and the request streams behind them.

EventStreamResponse aborts its engine requests however the response ends: finished, failed,
cancelled because the client went away (Starlette cancels the body on http.disconnect), or
never started at all. event_stream builds it once a refusal can no longer come (see there).

When a graceful shutdown runs out of time, LiveStreams.end_all() ends every stream still going
as a finished one ends (RequestStream.end_with_abort: a last output with finish_reason "abort"
for each choice still open), so the response writes its final chunk and [DONE] instead of being
cut (a /v1/responses stream: its closing events, ending in response.incomplete).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from folio.engine.async_llm import EngineDeadError, RequestStream
from folio.entrypoints.openai.errors import from_engine_error
from folio.outputs import RequestOutput

DONE = "data: [DONE]\n\n"


def sse(chunk: BaseModel, *, exclude: set[str] | None = None) -> str:
    return f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"


class ChunkFormat:
    """Events of one response, one choice each, written around a precomputed head.

    Every chunk of a response repeats id, object, created and model; serializing only the choice
    (the part that changes) keeps the event loop's work per token small, which is what the engine
    thread competes with for the GIL. The text equals `sse(ChunkModel(...))` for the same fields.
    """

    def __init__(self, request_id: str, object_name: str, created: int, model: str, usage_null: bool) -> None:
        head = json.dumps({"id": request_id, "object": object_name, "created": created, "model": model},
                          ensure_ascii=False, separators=(",", ":"))
        self._head = f'data: {head[:-1]},"choices":['
        # With stream_options.include_usage every chunk carries "usage": null but the last.
        self._tail = '],"usage":null}\n\n' if usage_null else "]}\n\n"

    def event(self, choice: BaseModel) -> str:
        return f"{self._head}{choice.model_dump_json()}{self._tail}"


class EventStreamResponse(StreamingResponse):
    def __init__(self, events: AsyncIterator[str], streams: list[RequestStream],
                 ns: Sequence[int] | None = None) -> None:
        """ns: each stream's number of choices (its params' n), which end_with_abort closes."""
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._streams = streams
        self._ns = list(ns or [1] * len(streams))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        live = getattr(getattr(scope.get("app"), "state", None), "live_streams", None)
        if live is not None:
            live.add(self)
        try:
            await super().__call__(scope, receive, send)
        finally:
            if live is not None:
                live.discard(self)
            abort_all(self._streams)
            await self._events.aclose()

    def end_with_abort(self) -> None:
        """Abort the engine requests still running, each ending its stream with finish_reason
        "abort" (shutdown: the response then ends as a finished one does)."""
        for stream, n in zip(self._streams, self._ns):
            stream.end_with_abort(n)


class LiveStreams(set):
    """The app's event streams being written (build_app keeps one in app.state.live_streams)."""

    def end_all(self) -> int:
        for response in list(self):
            response.end_with_abort()
        return len(self)


async def event_stream(events: AsyncIterator[str], streams: list[RequestStream],
                       params: Sequence[Any]) -> EventStreamResponse:
    """The streamed answer to requests the engine accepted with these params (one per stream).

    A request with a structured-output constraint can still be refused after it was accepted:
    its grammar compiles in the engine, and one that admits no output fails the request
    (LLMEngine._admit_compiled). Its streams are awaited first, so that refusal is a 400 as it
    is unstreamed, not a 200 whose one event is an error. Other requests are not awaited: nothing
    refuses them once accepted (a later failure is a 500 any stream may meet mid-way), and their
    headers go out at once, telling the client (and any proxy timing it) that it was accepted;
    their first event waits for the first token either way (chat's role chunk included).
    """
    if any(getattr(p, "structured_outputs", None) is not None for p in params):
        await wait_started(streams)
    return EventStreamResponse(events, streams, [getattr(p, "n", 1) for p in params])


async def wait_started(streams: list[RequestStream]) -> None:
    """Wait for every stream's first item (RequestStream.started: an output stays queued).

    A refusal (a ValueError) is the 400 final_outputs gives; an engine that died meanwhile is the
    503 an add would get, a broken request a 500 (what the stream's error event would have said).
    Any failure or cancellation (the client left: cancel_on_disconnect) aborts all the streams,
    since no response will read them."""
    try:
        if len(streams) == 1:
            await streams[0].started()
        else:
            await _first_failure(streams)
    except BaseException as e:
        abort_all(streams)
        if isinstance(e, Exception):
            raise from_engine_error(e) from None
        raise


async def _first_failure(streams: list[RequestStream]) -> None:
    """All streams started, or the first error among them at once (not after slower ones)."""
    tasks = [asyncio.ensure_future(s.started()) for s in streams]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        errors = [task.exception() for task in done if task.exception() is not None]  # each one retrieved
        if errors:
            raise errors[0]
    finally:
        for task in tasks:
            task.cancel()


def abort_all(streams: list[RequestStream]) -> None:
    for stream in streams:
        stream.abort()  # a no-op for a finished stream


async def iterate_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several streams, as each produces them."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    output = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(streams[i]))] = i
                yield i, output
    finally:
        for task in pending:
            task.cancel()


async def final_outputs(streams: list[RequestStream]) -> list[RequestOutput]:
    """The last output of each stream (FINAL_ONLY requests have just one); aborts on the way out."""
    try:
        return list(await asyncio.gather(*(_last(s) for s in streams)))
    except ValueError as e:  # refused after it was added (e.g. a constraint nothing satisfies): a 400
        raise from_engine_error(e) from None
    except EngineDeadError as e:  # the engine stopped (shutdown, a crash): a 503, as an add would get
        raise from_engine_error(e) from None
    finally:
        abort_all(streams)


async def _last(stream: RequestStream) -> RequestOutput:
    last = None
    async for output in stream:
        last = output
    if last is None:
        raise RuntimeError(f"Request {stream.request_id} ended without an output.")
    return last
