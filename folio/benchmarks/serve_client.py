"""One streamed /v1/completions request and its timings, against any OpenAI-compatible server.

The prompt is sent as token ids (the OpenAI API accepts a list of ints), with `ignore_eos` (a
vLLM extension folio's server shares) and `max_tokens` = the wanted length, greedy, streamed
with `stream_options.include_usage` so the server states how many tokens it generated.

Timings follow vLLM's benchmark_serving: TTFT is the time from sending to the first chunk that
carries a choice; each later chunk adds one inter-token latency (ITL); end-to-end latency runs to
the end of the stream; TPOT = (latency - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from folio.benchmarks.http_stream import HTTPStreamError, post_json
from folio.benchmarks.workloads import BenchRequest

HTTP_CLIENTS = ("asyncio", "httpx")  # http_stream's lean client (the default), or httpx


@dataclass
class RequestTrace:
    prompt_len: int
    wanted_output_len: int
    success: bool = False
    error: str | None = None
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0  # usage.completion_tokens, or the number of chunks if no usage came
    usage_reported: bool = False

    @property
    def tpot_s(self) -> float | None:
        if not self.success or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def exact_length(self) -> bool:
        return self.success and self.output_tokens == self.wanted_output_len


def completion_payload(model: str, request: BenchRequest) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": request.prompt_token_ids,
        "max_tokens": request.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class _BadStatus(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")


async def send_request(
    client: httpx.AsyncClient | None, url: str, model: str, request: BenchRequest, timeout_s: float | None = None
) -> RequestTrace:
    """Stream one completion through client, or through http_stream's lean client when it is None
    (timeout_s, if given, bounds its whole request; httpx's client carries its own timeouts);
    failures end up in the trace, never raised."""
    trace = RequestTrace(request.prompt_len, request.output_len)
    payload = completion_payload(model, request)
    events = _httpx_events(client, url, payload) if client is not None else _lean_events(url, payload)
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s if client is None else None):
            chunks = await _read_stream(events, trace, start)
        trace.latency_s = time.perf_counter() - start
    except TimeoutError:
        trace.error = f"no end of the stream within {timeout_s} s"
        return trace
    except (_BadStatus, httpx.HTTPError, HTTPStreamError, json.JSONDecodeError, ValueError) as e:
        trace.error = str(e) if isinstance(e, _BadStatus) else f"{type(e).__name__}: {e}"
        return trace
    finally:
        await events.aclose()
    if trace.error is not None:
        return trace
    if not trace.usage_reported:
        trace.output_tokens = chunks
    trace.success = chunks > 0
    if not trace.success:
        trace.error = "the stream carried no completion chunk"
    return trace


async def _read_stream(events: AsyncIterator[Any], trace: RequestTrace, start: float) -> int:
    """Time the stream's chunks into trace; returns how many carried a choice. An error event
    stops the stream and is set on trace."""
    chunks, last = 0, start
    async for data in events:
        now = time.perf_counter()
        if data.get("error"):
            trace.error = f"error in stream: {data['error']}"
            return chunks
        if data.get("choices"):
            if chunks == 0:
                trace.ttft_s = now - start
            else:
                trace.itl_s.append(now - last)
            chunks += 1
            last = now
        usage = data.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            trace.output_tokens = int(usage["completion_tokens"])
            trace.usage_reported = True
    return chunks


async def _httpx_events(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> AsyncIterator[Any]:
    """The JSON objects of a server-sent-event stream, up to `data: [DONE]`."""
    async with client.stream("POST", url, json=payload) as response:
        if response.status_code != 200:
            raise _BadStatus(response.status_code, (await response.aread()).decode("utf-8", "replace"))
        async for line in response.aiter_lines():
            line = line.strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


async def _lean_events(url: str, payload: dict[str, Any]) -> AsyncIterator[Any]:
    async with await post_json(url, payload) as response:
        if response.status != 200:
            raise _BadStatus(response.status, (await response.body()).decode("utf-8", "replace"))
        async for data in response.events():
            if data.strip() == b"[DONE]":
                return
            yield json.loads(data)
