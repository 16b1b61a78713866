"""LoRAMetrics: requests per adapter, running and waiting, as Prometheus series.

`vllm:lora_requests_info` is vLLM's gauge under vLLM's name (dashboards built for vLLM read it):
one sample whose labels list the adapters with running and with waiting requests (comma
separated) and max_lora, valued at the time of the update. `folio:lora_requests` gives the
counts behind it, one sample per adapter and state.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Gauge

from folio.engine.engine_stats import EngineStats


class LoRAMetrics:
    def __init__(self, registry: CollectorRegistry, labels: dict[str, str],
                 vllm_registry: CollectorRegistry | None = None) -> None:
        """vllm_registry: where vLLM-named series go (EngineMetrics exports it unless
        --metrics-compat none); default: `registry`."""
        self._labels = labels
        self.info = Gauge("vllm:lora_requests_info", "Running and waiting LoRA adapters (vLLM's gauge).",
                          ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                          registry=vllm_registry or registry)
        self.requests = Gauge("folio:lora_requests", "Requests per LoRA adapter, running or waiting.",
                              [*labels, "lora_name", "state"], registry=registry)

    def record(self, stats: EngineStats) -> None:
        if not stats.max_loras:
            return
        running = ",".join(name for name, _ in stats.lora_running)
        waiting = ",".join(name for name, _ in stats.lora_waiting)
        self.info.clear()  # one sample: the current sets, not every set ever seen
        self.info.labels(max_lora=str(stats.max_loras), running_lora_adapters=running,
                         waiting_lora_adapters=waiting).set(time.time())
        self.requests.clear()
        for state, counts in (("running", stats.lora_running), ("waiting", stats.lora_waiting)):
            for name, count in counts:
                self.requests.labels(**self._labels, lora_name=name, state=state).set(count)
