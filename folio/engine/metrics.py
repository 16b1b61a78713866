"""EngineMetrics: the Prometheus series a running engine exports, each named `folio:...`.

Every EngineMetrics owns its own CollectorRegistry, so several engines (several servers in one
test process) never collide on metric names. The engine thread records into it after each
step (`record_step`); the server's /metrics renders it (`render`).

Token counters follow the outputs the engine hands back: a streaming (DELTA) request adds its
tokens step by step, a non-streaming (FINAL_ONLY) one all at once when it finishes. Latency
histograms are observed once per request, when it finishes, from its RequestMetrics
(monotonic clock times).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from folio.engine.llm_engine import EngineStats
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
    tokens: dict[int, int] = field(default_factory=dict)  # completion index -> tokens so far
    reasons: dict[int, str] = field(default_factory=dict)  # completion index -> finish reason


class EngineMetrics:
    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # Every series carries the model name, as vLLM's do, so dashboards carry over.
        self._labels = {"model_name": model_name}
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
        self._success = {
            reason: success.labels(**self._labels, finished_reason=reason) for reason in ("stop", "length", "abort")
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
        return metric.labels(**self._labels)

    # ---- recording (engine thread) ----------------------------------------------------------
    def record_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        if stats.num_cpu_blocks:
            self.cpu_kv_usage.set(1.0 - stats.num_free_cpu_blocks / stats.num_cpu_blocks)
        for field, series in self._mirrored.items():
            value = getattr(stats, field)
            if value > self._seen[field]:
                series.inc(value - self._seen[field])
                self._seen[field] = value
        self._record_spec_per_position(stats.spec_decode_num_accepted_tokens_per_pos)

    def record_step(self, outputs: list[RequestOutput], seconds: float) -> None:
        self.steps.inc()
        self.step_seconds.inc(seconds)
        self.num_steps += 1
        self.busy_seconds += seconds
        for output in outputs:
            self._record_output(output)

    def record_abort(self, request_id: str) -> None:
        """An unfinished request was aborted (the client left, or shutdown)."""
        self._tallies.pop(request_id, None)
        self._success["abort"].inc()

    def _record_output(self, output: RequestOutput) -> None:
        tally = self._tallies.setdefault(output.request_id, _Tally())
        new_tokens = 0
        for completion in output.outputs:
            new_tokens += len(completion.token_ids)
            # A DELTA output carries the new tokens, a FINAL_ONLY one all of them. (CUMULATIVE
            # outputs would be counted again each step: the server never asks for them.)
            tally.tokens[completion.index] = tally.tokens.get(completion.index, 0) + len(completion.token_ids)
            if completion.finish_reason is not None:
                tally.reasons[completion.index] = completion.finish_reason
        if new_tokens and not tally.prompt_counted:
            tally.prompt_counted = True
            self.prompt_tokens.inc(len(output.prompt_token_ids))
        self.generation_tokens.inc(new_tokens)
        if output.finished:
            self._tallies.pop(output.request_id, None)
            self._record_finished(output, tally)

    def _record_finished(self, output: RequestOutput, tally: _Tally) -> None:
        reason = tally.reasons.get(0) or next(iter(tally.reasons.values()), "stop")
        if reason in self._success:
            self._success[reason].inc()
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
        return generate_latest(self.registry)
