"""ServeMetrics: throughput and latency percentiles over the traces of a serving benchmark."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from folio.benchmarks.serve_client import RequestTrace

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class LatencyStats:
    """Milliseconds; all zero when there were no samples."""

    mean_ms: float
    median_ms: float
    p90_ms: float
    p99_ms: float
    count: int

    @classmethod
    def of(cls, seconds: list[float]) -> LatencyStats:
        if not seconds:
            return cls(0.0, 0.0, 0.0, 0.0, 0)
        ms = sorted(s * 1e3 for s in seconds)
        return cls(statistics.fmean(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), len(ms))


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


@dataclass(frozen=True)
class ServeMetrics:
    completed: int
    failed: int
    exact_lengths: int  # completed requests that produced exactly max_tokens
    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    errors: list[str] = field(default_factory=list)  # a few distinct failure messages
    usage_missing: int = 0  # requests whose stream gave no usage: their lengths are chunk counts

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def total_token_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "completed": self.completed,
            "failed": self.failed,
            "exact_lengths": self.exact_lengths,
            "duration_s": self.duration_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "errors": self.errors,
            "usage_missing": self.usage_missing,
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            stats: LatencyStats = getattr(self, name)
            out.update({
                f"mean_{name}_ms": stats.mean_ms,
                f"median_{name}_ms": stats.median_ms,
                f"p90_{name}_ms": stats.p90_ms,
                f"p99_{name}_ms": stats.p99_ms,
            })
        return out


def compute_metrics(traces: list[RequestTrace], duration_s: float) -> ServeMetrics:
    done = [t for t in traces if t.success]
    return ServeMetrics(
        completed=len(done),
        failed=len(traces) - len(done),
        exact_lengths=sum(t.exact_length for t in done),
        duration_s=duration_s,
        input_tokens=sum(t.prompt_len for t in done),
        output_tokens=sum(t.output_tokens for t in done),
        ttft=LatencyStats.of([t.ttft_s for t in done]),
        tpot=LatencyStats.of([t.tpot_s for t in done if t.tpot_s is not None]),
        itl=LatencyStats.of([x for t in done for x in t.itl_s]),
        e2el=LatencyStats.of([t.latency_s for t in done]),
        errors=sorted({t.error for t in traces if t.error})[:5],
        usage_missing=sum(not t.usage_reported for t in done),
    )


def format_metrics(m: ServeMetrics, title: str = "Serving Benchmark Result") -> str:
    width = 50
    lines = [f" {title} ".center(width, "="),
             _row("Successful requests:", m.completed),
             _row("Failed requests:", m.failed),
             _row("Requests with exact output length:", f"{m.exact_lengths}/{m.completed}"),
             _row("Benchmark duration (s):", f"{m.duration_s:.2f}"),
             _row("Total input tokens:", m.input_tokens),
             _row("Total generated tokens:", m.output_tokens),
             _row("Request throughput (req/s):", f"{m.request_throughput:.2f}"),
             _row("Output token throughput (tok/s):", f"{m.output_throughput:.2f}"),
             _row("Total token throughput (tok/s):", f"{m.total_token_throughput:.2f}")]
    for name, label in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        stats: LatencyStats = getattr(m, name)
        key = name.upper()
        lines += [f"{label}".center(width, "-"),
                  _row(f"Mean {key} (ms):", f"{stats.mean_ms:.2f}"),
                  _row(f"Median {key} (ms):", f"{stats.median_ms:.2f}"),
                  _row(f"P90 {key} (ms):", f"{stats.p90_ms:.2f}"),
                  _row(f"P99 {key} (ms):", f"{stats.p99_ms:.2f}")]
    lines.append("=" * width)
    if m.usage_missing:
        lines.append(f"note: {m.usage_missing} streams reported no usage; their lengths are chunk counts")
    lines += [f"error: {e}" for e in m.errors]
    return "\n".join(lines)


def _row(label: str, value: Any) -> str:
    return f"{label:<40}{value:>10}"
