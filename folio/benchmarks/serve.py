"""The serving benchmark: send a workload to a running server at a rate, with a concurrency cap.

Arrivals follow a Poisson process of `request_rate` requests/s (exponential gaps drawn from a
seeded generator), or all at once for rate inf, as in vLLM's benchmark_serving; at most
`max_concurrency` requests are in flight when a cap is given. The clock runs from the first send
to the last response.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm.auto import tqdm

from folio.benchmarks.serve_client import HTTP_CLIENTS, RequestTrace, send_request
from folio.benchmarks.serve_metrics import ServeMetrics, compute_metrics
from folio.benchmarks.workloads import BenchRequest, Workload


@dataclass(frozen=True)
class ServeOptions:
    base_url: str  # e.g. http://127.0.0.1:8000
    model: str
    endpoint: str = "/v1/completions"
    request_rate: float = math.inf  # requests per second; inf sends everything at once
    max_concurrency: int | None = None
    seed: int = 0  # for the arrival times
    timeout_s: float = 6 * 3600  # per request (the lean client: the whole request; httpx: each read)
    ready_timeout_s: float = 0.0  # how long to wait for the server to come up before failing
    progress: bool = True
    # Untimed requests first (shaped like the workload's first ones, at most 16 tokens each, all at
    # once), as the offline benchmark warms its engine up and vLLM's `bench serve` sends a test prompt.
    warmup_requests: int = 1
    # The client that sends the requests: http_stream's lean one on asyncio, or httpx (~1 ms a request
    # and ~30 us an event more on the H100 host, charged to the server's figures; session 21).
    http_client: str = "asyncio"

    def __post_init__(self) -> None:
        if self.http_client not in HTTP_CLIENTS:
            raise ValueError(f"http_client must be one of {', '.join(HTTP_CLIENTS)}, got {self.http_client!r}.")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be positive (or inf), got {self.request_rate}.")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}.")
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}.")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}.")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.endpoint


@dataclass(frozen=True)
class ServeRun:
    metrics: ServeMetrics
    traces: list[RequestTrace]
    server_wait_s: float  # how long the server took to answer /v1/models


def arrival_offsets(num_requests: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent."""
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(num_requests):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def run_serve_benchmark(workload: Workload, options: ServeOptions) -> ServeRun:
    return asyncio.run(_run(workload, options))


async def _run(workload: Workload, options: ServeOptions) -> ServeRun:
    limits = httpx.Limits(max_connections=options.max_concurrency, max_keepalive_connections=None)
    timeout = httpx.Timeout(options.timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        waited = await _wait_for_server(client, options)
        if options.http_client != "httpx":
            client = None  # send_request's lean client; httpx only polled for the server above
        await _warm_up(client, options, workload)
        bar = tqdm(total=workload.num_requests, desc="requests", disable=not options.progress, dynamic_ncols=True)
        gate = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None
        offsets = arrival_offsets(workload.num_requests, options.request_rate, options.seed)
        start = time.perf_counter()
        tasks = [
            asyncio.create_task(_send_at(client, options, r, start + offset, gate, bar))
            for r, offset in zip(workload.requests, offsets)
        ]
        traces = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
        bar.close()
    return ServeRun(compute_metrics(traces, duration), traces, waited)


async def _warm_up(client: httpx.AsyncClient | None, options: ServeOptions, workload: Workload) -> None:
    """The untimed requests; a failed one stops the benchmark (the timed run would fail too).
    Their prompts are the workload's first ones reversed: the same lengths and tokens, but no
    prefix a timed request could find in the server's prefix cache."""
    if options.warmup_requests == 0 or not workload.requests:
        return
    picks = [workload.requests[i % workload.num_requests] for i in range(options.warmup_requests)]
    short = [BenchRequest(r.prompt_token_ids[::-1], min(r.output_len, 16)) for r in picks]
    traces = await asyncio.gather(*(send_request(client, options.url, options.model, r, options.timeout_s)
                                    for r in short))
    failed = [t for t in traces if not t.success]
    if failed:
        raise ValueError(f"{len(failed)} of {len(traces)} warm-up requests failed: {failed[0].error}")


async def _send_at(
    client: httpx.AsyncClient | None,
    options: ServeOptions,
    request: BenchRequest,
    when: float,
    gate: asyncio.Semaphore | None,
    bar: Any,
) -> RequestTrace:
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    if gate is None:
        trace = await send_request(client, options.url, options.model, request, options.timeout_s)
    else:
        async with gate:
            trace = await send_request(client, options.url, options.model, request, options.timeout_s)
    bar.update(1)
    return trace


async def _wait_for_server(client: httpx.AsyncClient, options: ServeOptions) -> float:
    """Seconds until GET /v1/models answered 200, polling up to ready_timeout_s; fail clearly."""
    url = options.base_url.rstrip("/") + "/v1/models"
    start = time.perf_counter()
    deadline = start + options.ready_timeout_s
    while True:
        try:
            response = await client.get(url, timeout=10.0)
            if response.status_code == 200:
                return time.perf_counter() - start
            problem = f"HTTP {response.status_code}"
        except httpx.HTTPError as e:
            problem = f"{type(e).__name__}: {e}"
        if time.perf_counter() >= deadline:
            raise ValueError(f"No server answers at {options.base_url} ({problem}).")
        await asyncio.sleep(0.5)
