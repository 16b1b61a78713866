"""StateHistory: per-second throughput, TTFT and ITL over the last minutes, for the dashboard.

Fed on the frontend (AsyncLLM's event loop) by every Stepped message while the dashboard is on:
per step it adds the step's generated tokens, the engine's computed-token counter delta, and a
TTFT or ITL sample per output that carries tokens, into the bucket of the current second. That
is O(outputs of the step), the same order as the Prometheus metrics already recorded there.

Latencies come from each output's RequestMetrics (monotonic times, the same clock in an engine
process): a request's first output with tokens gives its TTFT (first_token_time - arrival_time)
and, when it brings several tokens at once (a non-streaming request's only output), their mean
gap; every later output gives the gap since the previous one over its new tokens. ITL is the
token-weighted mean gap of the second.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from folio.outputs import RequestOutput

DEFAULT_WINDOW_S = 300


@dataclass
class _Bucket:
    second: int
    generation_tokens: int = 0
    computed_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    itl_sum: float = 0.0  # sum over tokens of their gap
    itl_tokens: int = 0


class StateHistory:
    def __init__(self, num_computed_tokens: int = 0, window_s: int = DEFAULT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s < 1:
            raise ValueError(f"window_s must be a positive integer, got {window_s!r}.")
        self.window_s = window_s
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()
        self._last_token_time: dict[str, float] = {}  # unfinished request id -> its last token's time
        self._computed_tokens = num_computed_tokens  # the engine's counter at the last step

    # ---- recording --------------------------------------------------------------------------
    def record_step(self, outputs: list[RequestOutput], num_computed_tokens: int) -> None:
        bucket = self._bucket()
        bucket.computed_tokens += max(0, num_computed_tokens - self._computed_tokens)
        self._computed_tokens = num_computed_tokens
        for output in outputs:
            self._record_output(bucket, output)

    def forget(self, request_id: str) -> None:
        """The request was aborted: it sends no more outputs."""
        self._last_token_time.pop(request_id, None)

    def _record_output(self, bucket: _Bucket, output: RequestOutput) -> None:
        new_tokens = max((len(c.token_ids) for c in output.outputs), default=0)
        bucket.generation_tokens += sum(len(c.token_ids) for c in output.outputs)
        m = output.metrics
        if new_tokens and m is not None and m.last_token_time is not None:
            previous = self._last_token_time.get(output.request_id)
            if previous is None and m.first_token_time is not None:
                bucket.ttft_sum += max(0.0, m.first_token_time - m.arrival_time)
                bucket.ttft_count += 1
                previous, new_tokens = m.first_token_time, new_tokens - 1
            if previous is not None and new_tokens > 0:
                bucket.itl_sum += max(0.0, m.last_token_time - previous)
                bucket.itl_tokens += new_tokens
            self._last_token_time[output.request_id] = m.last_token_time
        if output.finished:
            self._last_token_time.pop(output.request_id, None)

    def _bucket(self) -> _Bucket:
        second = int(self._clock())
        if not self._buckets or self._buckets[-1].second != second:
            self._buckets.append(_Bucket(second))
            while self._buckets[0].second <= second - self.window_s:
                self._buckets.popleft()
        return self._buckets[-1]

    # ---- reading ----------------------------------------------------------------------------
    def series(self) -> dict[str, Any]:
        """The last window_s whole seconds, oldest first (the current second is still filling):
        rates per second, and mean latencies in seconds (null where no sample fell)."""
        end = int(self._clock())
        seconds = range(end - self.window_s, end)
        by_second = {b.second: b for b in self._buckets}
        rows = [by_second.get(s) or _Bucket(s) for s in seconds]
        return {
            "interval_s": 1,
            "length": self.window_s,
            "generation_tokens_per_s": [b.generation_tokens for b in rows],
            "computed_tokens_per_s": [b.computed_tokens for b in rows],
            "ttft_s": [_mean(b.ttft_sum, b.ttft_count) for b in rows],
            "itl_s": [_mean(b.itl_sum, b.itl_tokens) for b in rows],
        }


def _mean(total: float, count: int) -> float | None:
    return round(total / count, 6) if count else None
