"""One streamed /v1/completions request and its timings, against any OpenAI-compatible server.

The prompt is sent as token ids (the OpenAI API accepts a list of ints), with `ignore_eos` (a
vLLM extension folio's server shares) and `max_tokens` = the wanted length, greedy, streamed
with `stream_options.include_usage` so the server states how many tokens it generated.

Timings follow vLLM's benchmark_serving: TTFT is the time from sending to the first chunk that
carries a choice; each later chunk adds one inter-token latency (ITL); end-to-end latency runs to
the end of the stream; TPOT = (latency - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from folio.benchmarks.workloads import BenchRequest


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


async def send_request(
    client: httpx.AsyncClient, url: str, model: str, request: BenchRequest
) -> RequestTrace:
    """Stream one completion; failures end up in the trace, never raised."""
    trace = RequestTrace(request.prompt_len, request.output_len)
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", url, json=completion_payload(model, request)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                trace.error = f"HTTP {response.status_code}: {body[:300]}"
                return trace
            async for data in _sse_data(response):
                now = time.perf_counter()
                if data.get("error"):
                    trace.error = f"error in stream: {data['error']}"
                    return trace
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
        trace.latency_s = time.perf_counter() - start
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as e:
        trace.error = f"{type(e).__name__}: {e}"
        return trace
    if not trace.usage_reported:
        trace.output_tokens = chunks
    trace.success = chunks > 0
    if not trace.success:
        trace.error = "the stream carried no completion chunk"
    return trace


async def _sse_data(response: httpx.Response) -> Any:
    """The JSON objects of a server-sent-event stream, up to `data: [DONE]`."""
    async for line in response.aiter_lines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
