"""EngineMetrics records a step's token counts and inter-token gaps once per step: the series
must read exactly as if every output had been recorded on its own, as prometheus_client's
observe() would (counts, sum and every bucket)."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from folio.engine import metrics as metrics_module
from folio.engine.metrics import EngineMetrics
from folio.outputs import CompletionOutput, RequestMetrics, RequestOutput


def _steps(seed: int) -> list[list[RequestOutput]]:
    """Streamed outputs of 12 requests over 30 steps: one or several tokens an output, gaps that
    land in many buckets (some exactly on a bound), a second completion for some (n = 2)."""
    rng = random.Random(seed)
    bounds = metrics_module._TPOT_BUCKETS
    last: dict[str, float] = {}
    steps, now = [], 100.0
    left = {f"r{i}": rng.randint(3, 25) for i in range(12)}
    for _ in range(30):
        now += rng.choice([rng.random() * 0.3, bounds[rng.randrange(len(bounds))]])
        outputs = []
        for rid, n in list(left.items()):
            if rng.random() < 0.3:
                continue
            k = min(n, rng.choice([1, 1, 1, 2, 4]))
            left[rid] -= k
            done = left[rid] == 0
            completions = [CompletionOutput(i, "", [7] * k, None, None, "length" if done else None)
                           for i in range(2 if rid in ("r3", "r7") else 1)]
            first = last.setdefault(rid, now)
            outputs.append(RequestOutput(rid, None, [1, 2, 3], None, completions, done,
                                         RequestMetrics(90.0, 95.0, first, now, now if done else None)))
            if done:
                del left[rid]
        steps.append(outputs)
    return steps


def _reference(steps: list[list[RequestOutput]]) -> tuple[Histogram, int]:
    """What one observe() per token gap gives, and the generated tokens."""
    histogram = Histogram("itl", "x", buckets=metrics_module._TPOT_BUCKETS, registry=CollectorRegistry())
    previous: dict[str, float] = {}
    tokens = 0
    for outputs in steps:
        for o in outputs:
            tokens += sum(len(c.token_ids) for c in o.outputs)
            new = max(len(c.token_ids) for c in o.outputs)
            start = previous.get(o.request_id)
            if start is None:
                start, new = o.metrics.first_token_time, new - 1
            previous[o.request_id] = o.metrics.last_token_time
            for _ in range(new):
                histogram.observe(max(0.0, o.metrics.last_token_time - start) / new)
    return histogram, tokens


def _samples(histogram) -> dict[str, float]:
    return {s.name.rsplit("_", 1)[-1] + s.labels.get("le", ""): s.value
            for metric in histogram.collect() for s in metric.samples if not s.name.endswith("_created")}


def test_a_steps_outputs_read_as_if_recorded_one_by_one():
    steps = _steps(3)
    metrics = EngineMetrics("m")
    for outputs in steps:
        metrics.record_step(outputs, 0.01)
    want, tokens = _reference(steps)
    got = _samples(metrics.itl)
    assert got.keys() == _samples(want).keys()
    for key, value in _samples(want).items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
    assert got["count"] > 50  # many gaps, over several buckets
    text = metrics.render().decode()
    assert f'folio:generation_tokens_total{{model_name="m"}} {float(tokens)}' in text
    assert f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {float(tokens)}' in text


def test_histograms_without_prometheus_internals_fall_back_to_observe():
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, value: float) -> None:
            self.seen.append(value)

    plain = Plain()
    batch = metrics_module._HistogramBatch(plain)
    batch.add(0.5, 3)
    batch.add(0.02, 1)
    assert plain.seen == []  # nothing before the flush
    batch.flush()
    assert plain.seen == [0.5, 0.5, 0.5, 0.02]
