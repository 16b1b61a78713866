"""EngineMetrics: the Prometheus series a running engine exports, each named `folio:...`.

Every EngineMetrics owns its own CollectorRegistry, so several engines (several servers in one
test process) never collide on metric names. The engine thread records into it after each
step (`record_step`); the server's /metrics renders it (`render`).

Token counters follow the outputs the engine hands back: a streaming (DELTA) request adds its
tokens step by step, a non-streaming (FINAL_ONLY) one all at once when it finishes. Latency
histograms are observed once per request, when it finishes, from its RequestMetrics
(monotonic clock times).

vLLM's names (`vllm:num_requests_running`, ...) are recorded beside folio's own in a second
registry, so dashboards built for vLLM work; the server exports them unless started with
`--metrics-compat none` (`export_vllm`). vllm:inter_token_latency_seconds observes each gap
between tokens: from step to step for streamed requests, and the request's mean gap once per
token for requests that report only at the end.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from folio.engine.engine_stats import EngineStats
from folio.engine.lora_metrics import LoRAMetrics
from folio.outputs import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                50.0, 60.0, 120.0, 240.0, 480.0)


@dataclass
class _Tally:
    """What metrics remember about one unfinished request."""

    prompt_counted: bool = False
    last_token_time: float | None = None  # when the latest token seen so far was made
    tokens: dict[int, int] = field(default_factory=dict)  # completion index -> tokens so far
    reasons: dict[int, str] = field(default_factory=dict)  # completion index -> finish reason


def observe_repeated(histogram, value: float, count: int) -> None:
    """`count` observations of one value at the cost of one: a request reported only at its end
    has one gap per token, and the event loop should not pay a call per token for them.
    prometheus_client has no weighted observe, so this adds to the sum and to the bucket that
    observe() would (its `_sum`, `_buckets`, `_upper_bounds`), or loops where those are missing."""
    buckets, bounds = getattr(histogram, "_buckets", None), getattr(histogram, "_upper_bounds", None)
    if buckets is None or bounds is None:
        for _ in range(count):
            histogram.observe(value)
        return
    histogram._sum.inc(value * count)
    buckets[bisect.bisect_left(bounds, value)].inc(count)  # the first bound >= value, as observe()


class _HistogramBatch:
    """One step's observations of a histogram, added at the step's end: the sum once and each
    bucket touched once (as observe_repeated), not a locked increment per output. With ~256
    streamed outputs a step, the per-output increments were the server event loop's largest cost
    per token (session 21)."""

    def __init__(self, histogram) -> None:
        self.histogram = histogram
        self.bounds = getattr(histogram, "_upper_bounds", None)
        self.whole = self.bounds is not None and getattr(histogram, "_buckets", None) is not None
        self.total = 0.0
        self.counts: dict[int, int] = {}  # bucket index -> observations
        self.loose: list[tuple[float, int]] = []  # (value, count) where the internals are missing

    def add(self, value: float, count: int) -> None:
        if not self.whole:
            self.loose.append((value, count))
            return
        self.total += value * count
        index = bisect.bisect_left(self.bounds, value)  # the first bound >= value, as observe()
        self.counts[index] = self.counts.get(index, 0) + count

    def flush(self) -> None:
        for value, count in self.loose:
            observe_repeated(self.histogram, value, count)
        if self.counts:
            self.histogram._sum.inc(self.total)
            for index, count in self.counts.items():
                self.histogram._buckets[index].inc(count)


class _Fanout:
    """One recording call into folio's series and vLLM's twin of it."""

    def __init__(self, *children) -> None:
        self._children = children

    def set(self, value: float) -> None:
        for child in self._children:
            child.set(value)

    def inc(self, amount: float = 1.0) -> None:
        for child in self._children:
            child.inc(amount)

    def observe(self, value: float) -> None:
        for child in self._children:
            child.observe(value)


# vLLM's 1-2-5 buckets for token counts.
_LENGTH_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))

# folio series -> vLLM's name for the same quantity (prometheus_client adds _total to counters).
VLLM_NAMES = {
    "folio:num_requests_running": "vllm:num_requests_running",
    "folio:num_requests_waiting": "vllm:num_requests_waiting",
    "folio:kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "folio:num_preemptions": "vllm:num_preemptions",
    "folio:prompt_tokens": "vllm:prompt_tokens",
    "folio:generation_tokens": "vllm:generation_tokens",
    "folio:prefix_cache_queries": "vllm:prefix_cache_queries",
    "folio:prefix_cache_hits": "vllm:prefix_cache_hits",
    "folio:time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "folio:time_per_output_token_seconds": "vllm:request_time_per_output_token_seconds",
    "folio:e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "folio:spec_decode_num_drafts": "vllm:spec_decode_num_drafts",
    "folio:spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "folio:spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


class EngineMetrics:
    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.vllm_registry = CollectorRegistry()  # vLLM's names, rendered when export_vllm
        self.export_vllm = True
        # Every series carries the model name, as vLLM's do, so dashboards carry over.
        self._labels = {"model_name": model_name}
        self._vllm_labels = {"model_name": model_name, "engine": "0"}  # vLLM v1 numbers its engines
        self.itl = self._vllm_series(Histogram, "vllm:inter_token_latency_seconds",
                                     "Time between consecutive output tokens.", buckets=_TPOT_BUCKETS)
        self.request_prompt_tokens = self._vllm_series(Histogram, "vllm:request_prompt_tokens",
                                                       "Prompt tokens per finished request.", buckets=_LENGTH_BUCKETS)
        self.request_generation_tokens = self._vllm_series(
            Histogram, "vllm:request_generation_tokens", "Generated tokens per finished request.", buckets=_LENGTH_BUCKETS
        )
        self.running = self._series(Gauge, "folio:num_requests_running", "Sequences in the running batch.")
        self.waiting = self._series(Gauge, "folio:num_requests_waiting", "Sequences waiting to be scheduled.")
        self.kv_usage = self._series(Gauge, "folio:kv_cache_usage_perc", "Fraction of KV blocks in use, 0 to 1.")
        self.preemptions = self._series(Counter, "folio:num_preemptions", "Sequences preempted for lack of KV blocks.")
        self.prompt_tokens = self._series(Counter, "folio:prompt_tokens", "Prompt tokens of requests that produced output.")
        self.generation_tokens = self._series(Counter, "folio:generation_tokens", "Generated tokens.")
        self.prefix_queries = self._series(Counter, "folio:prefix_cache_queries",
                                           "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = self._series(Counter, "folio:prefix_cache_hits",
                                        "Prompt tokens found in the prefix cache (not computed).")
        self.swapped_out = self._series(Counter, "folio:kv_blocks_swapped_out", "KV blocks swapped out to CPU.")
        self.swapped_in = self._series(Counter, "folio:kv_blocks_swapped_in", "KV blocks swapped back in.")
        self.cpu_kv_usage = self._series(Gauge, "folio:cpu_kv_cache_usage_perc",
                                         "Fraction of CPU swap blocks in use, 0 to 1.")
        self.steps = self._series(Counter, "folio:engine_steps", "Engine steps taken.")
        self.step_seconds = self._series(Counter, "folio:engine_step_seconds", "Seconds spent inside engine steps.")
        self.ttft = self._series(Histogram, "folio:time_to_first_token_seconds",
                                 "Time from arrival to the first token.", buckets=_TTFT_BUCKETS)
        self.tpot = self._series(Histogram, "folio:time_per_output_token_seconds",
                                 "Mean time between output tokens, per request.", buckets=_TPOT_BUCKETS)
        self.e2e = self._series(Histogram, "folio:e2e_request_latency_seconds",
                                "Time from arrival to the last token.", buckets=_E2E_BUCKETS)
        success = Counter("folio:request_success", "Finished requests, by finish reason.",
                          [*self._labels, "finished_reason"], registry=self.registry)
        vllm_success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                               [*self._vllm_labels, "finished_reason"], registry=self.vllm_registry)
        self._success = {
            reason: _Fanout(success.labels(**self._labels, finished_reason=reason),
                            vllm_success.labels(**self._vllm_labels, finished_reason=reason))
            for reason in ("stop", "length", "abort")
        }
        self._add_spec_decode_series()
        self._tallies: dict[str, _Tally] = {}
        # Counters mirrored from the engine's cumulative stats: (series, EngineStats field, last value).
        self._mirrored = {
            "num_preemptions": self.preemptions,
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "num_swapped_out_blocks": self.swapped_out,
            "num_swapped_in_blocks": self.swapped_in,
            "spec_decode_num_drafts": self.spec_drafts,
            "spec_decode_num_draft_tokens": self.spec_draft_tokens,
            "spec_decode_num_accepted_tokens": self.spec_accepted,
        }
        self._seen: dict[str, int] = dict.fromkeys(self._mirrored, 0)
        self.lora = LoRAMetrics(self.registry, self._labels, self.vllm_registry)
        self.num_steps = 0  # plain copies of the step series, for in-process measurements
        self.busy_seconds = 0.0

    def _add_spec_decode_series(self) -> None:
        """vLLM's spec_decode counters (zero unless speculative decoding is on)."""
        self.spec_drafts = self._series(Counter, "folio:spec_decode_num_drafts", "Request-steps that verified drafts.")
        self.spec_draft_tokens = self._series(Counter, "folio:spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = self._series(Counter, "folio:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self._spec_per_pos = Counter(
            "folio:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by draft position.",
            [*self._labels, "position"], registry=self.registry,
        )
        self._spec_per_pos_seen: list[int] = []

    def _record_spec_per_position(self, accepted: tuple[int, ...]) -> None:
        for position, value in enumerate(accepted):
            if position == len(self._spec_per_pos_seen):
                self._spec_per_pos_seen.append(0)
            if value > self._spec_per_pos_seen[position]:
                self._spec_per_pos.labels(**self._labels, position=str(position)).inc(value - self._spec_per_pos_seen[position])
                self._spec_per_pos_seen[position] = value

    def _series(self, kind, name: str, documentation: str, **kwargs):
        metric = kind(name, documentation, list(self._labels), registry=self.registry, **kwargs)
        child = metric.labels(**self._labels)
        if name not in VLLM_NAMES:
            return child
        return _Fanout(child, self._vllm_series(kind, VLLM_NAMES[name], documentation, **kwargs))

    def _vllm_series(self, kind, name: str, documentation: str, **kwargs):
        metric = kind(name, documentation, list(self._vllm_labels), registry=self.vllm_registry, **kwargs)
        return metric.labels(**self._vllm_labels)

    # ---- recording (engine thread) ----------------------------------------------------------
    def record_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        if stats.num_cpu_blocks:
            self.cpu_kv_usage.set(1.0 - stats.num_free_cpu_blocks / stats.num_cpu_blocks)
        for name, series in self._mirrored.items():
            value = getattr(stats, name)
            if value > self._seen[name]:
                series.inc(value - self._seen[name])
                self._seen[name] = value
        self.lora.record(stats)
        self._record_spec_per_position(stats.spec_decode_num_accepted_tokens_per_pos)

    def record_step(self, outputs: list[RequestOutput], seconds: float) -> None:
        self.steps.inc()
        self.step_seconds.inc(seconds)
        self.num_steps += 1
        self.busy_seconds += seconds
        itl = _HistogramBatch(self.itl)  # the step's tokens and gaps go in once, at its end
        generated = sum(self._record_output(output, itl) for output in outputs)
        if generated:
            self.generation_tokens.inc(generated)
        itl.flush()

    def record_abort(self, request_id: str) -> None:
        """An unfinished request was aborted (the client left, or shutdown)."""
        self._tallies.pop(request_id, None)
        self._success["abort"].inc()

    def _record_output(self, output: RequestOutput, itl: _HistogramBatch) -> int:
        """Record one output; returns its new tokens (the caller adds a step's at once)."""
        tally = self._tallies.setdefault(output.request_id, _Tally())
        new_tokens = longest = 0
        for completion in output.outputs:
            n = len(completion.token_ids)
            new_tokens += n
            longest = max(longest, n)
            # A DELTA output carries the new tokens, a FINAL_ONLY one all of them. (CUMULATIVE
            # outputs would be counted again each step: the server never asks for them.)
            tally.tokens[completion.index] = tally.tokens.get(completion.index, 0) + n
            if completion.finish_reason is not None:
                tally.reasons[completion.index] = completion.finish_reason
        if longest:
            self._record_token_gaps(output, tally, longest, itl)
        if new_tokens and not tally.prompt_counted:
            tally.prompt_counted = True
            self.prompt_tokens.inc(len(output.prompt_token_ids))
        if output.finished:
            self._tallies.pop(output.request_id, None)
            self._record_finished(output, tally)
        return new_tokens

    def _record_token_gaps(self, output: RequestOutput, tally: _Tally, new_tokens: int, itl: _HistogramBatch) -> None:
        """vllm:inter_token_latency_seconds: each of this output's tokens but a request's very
        first gets the time since the previous output, shared equally between its tokens."""
        m = output.metrics
        if m is None or m.last_token_time is None or not new_tokens:
            return
        previous, tally.last_token_time = tally.last_token_time, m.last_token_time
        if previous is None:
            previous, new_tokens = m.first_token_time, new_tokens - 1  # the first has no gap
        if previous is None or new_tokens < 1:
            return
        itl.add(max(0.0, m.last_token_time - previous) / new_tokens, new_tokens)

    def _record_finished(self, output: RequestOutput, tally: _Tally) -> None:
        reason = tally.reasons.get(0) or next(iter(tally.reasons.values()), "stop")
        if reason in self._success:
            self._success[reason].inc()
        self.request_prompt_tokens.observe(len(output.prompt_token_ids))
        self.request_generation_tokens.observe(sum(tally.tokens.values()))
        m = output.metrics
        if m is None:
            return
        end = m.finished_time if m.finished_time is not None else time.monotonic()
        self.e2e.observe(max(0.0, end - m.arrival_time))
        if m.first_token_time is None:
            return
        self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
        longest = max(tally.tokens.values(), default=0)
        if longest > 1 and m.last_token_time is not None:
            self.tpot.observe(max(0.0, m.last_token_time - m.first_token_time) / (longest - 1))

    # ---- reading ----------------------------------------------------------------------------
    def render(self) -> bytes:
        """The Prometheus text exposition of every series."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.vllm_registry) if self.export_vllm else text
