"""vLLM-named metrics: the batched histogram update equals one observe() per value."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from folio.engine.metrics import observe_repeated


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for metric in registry.collect() for s in metric.samples
            if not s.name.endswith("_created")]


def test_observe_repeated_equals_a_loop_of_observe():
    buckets = (0.001, 0.01, 0.1, 1.0)
    reg_a, reg_b = CollectorRegistry(), CollectorRegistry()
    a, b = Histogram("h", "x", buckets=buckets, registry=reg_a), Histogram("h", "x", buckets=buckets, registry=reg_b)
    for value, count in ((0.0005, 3), (0.01, 2), (0.05, 7), (3.0, 4), (1.0, 1)):
        for _ in range(count):
            a.observe(value)
        observe_repeated(b, value, count)
    got, want = _samples(reg_b), _samples(reg_a)
    assert [(n, labels) for n, labels, _ in got] == [(n, labels) for n, labels, _ in want]
    assert [v for *_, v in got] == pytest.approx([v for *_, v in want])  # sums differ in the last bit
