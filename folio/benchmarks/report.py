"""ThroughputReport: everything one `folio bench throughput` run measured, as text and as JSON."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from typing import Any

from folio.benchmarks.floor import Floor, ModelCost, WorkloadCost
from folio.benchmarks.hardware import DeviceLimits
from folio.benchmarks.result import RunResult
from folio.benchmarks.workloads import Workload

_KIB = 1024


@dataclass
class ThroughputReport:
    model: str
    dtype: str
    device: str
    load_format: str
    workload: Workload
    folio: RunResult
    folio_subset: RunResult | None = None  # folio on the peers' subset, when they ran one
    peers: list[RunResult] = field(default_factory=list)
    peer_workload: Workload | None = None  # what the peers ran: the workload or its first N requests
    limits: DeviceLimits | None = None
    model_cost: ModelCost | None = None
    workload_cost: WorkloadCost | None = None
    floor: Floor | None = None
    engine_stats: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # ---- comparisons ------------------------------------------------------------------------
    def ratio_to(self, peer: RunResult) -> float | None:
        """folio's output tok/s over the peer's, both measured on the same requests."""
        folio = self.folio_subset or self.folio
        if not peer.ok or peer.output_tok_s <= 0 or not folio.ok:
            return None
        return folio.output_tok_s / peer.output_tok_s

    def floor_fraction(self) -> float | None:
        return self.floor.fraction(self.folio.output_tok_s) if self.floor else None

    # ---- output -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "dtype": self.dtype,
            "device": self.device,
            "load_format": self.load_format,
            "workload": _workload_dict(self.workload),
            "peer_workload": _workload_dict(self.peer_workload) if self.peer_workload else None,
            "results": [r.to_dict() for r in self._runs()],
            "folio_over_peer": {p.system: self.ratio_to(p) for p in self.peers},
            "device_limits": self.limits.to_dict() if self.limits else None,
            "floor": self.floor.to_dict() if self.floor else None,
            "floor_fraction": self.floor_fraction(),
            "engine_stats": self.engine_stats,
            "notes": self.notes,
            "versions": _versions(),
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    def format_text(self) -> str:
        lines = [
            f"model:    {self.model} ({self.dtype}, load format {self.load_format}) on {self.device}",
            f"workload: {self.workload.describe()}",
            "",
            *self._results_table(),
            *self._checks(),
        ]
        if self.peers and self.peer_workload is not None and self.peer_workload is not self.workload:
            lines.append(
                f"peers ran the first {self.peer_workload.num_requests} requests only "
                f"({self.peer_workload.describe()}); their tok/s are measured on that subset, "
                "and folio × compares them with folio on the same subset."
            )
        lines += ["", *self._floor_lines()]
        if self.engine_stats:
            lines += ["", "engine stats after the run: " + _kv(self.engine_stats)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _runs(self) -> list[RunResult]:
        return [self.folio, *([self.folio_subset] if self.folio_subset else []), *self.peers]

    def _results_table(self) -> list[str]:
        header = (f"{'system':<34} {'requests':>8} {'elapsed s':>9} {'req/s':>8} {'output tok/s':>13} "
                  f"{'total tok/s':>12}  folio ×")
        rows = [header, "-" * len(header)]
        for r in self._runs():
            if r.error:
                rows.append(f"{r.system:<34} {r.num_requests:>8} failed: {r.error}")
                continue
            ratio = "" if r.system.startswith(self.folio.system) else _ratio(self.ratio_to(r))
            rows.append(
                f"{r.system:<34} {r.num_requests:>8} {r.elapsed_s:>9.2f} {r.requests_per_s:>8.2f} "
                f"{r.output_tok_s:>13,.0f} {r.total_tok_s:>12,.0f}  {ratio}"
            )
        return rows

    def _checks(self) -> list[str]:
        lines = []
        for r in self._runs():
            if r.error:
                continue
            if r.wrong_lengths:
                sample = ", ".join(f"#{i}: {n}" for i, n in list(r.wrong_lengths.items())[:5])
                lines.append(f"{r.system}: {len(r.wrong_lengths)} requests did NOT produce their length ({sample})")
            else:
                lines.append(f"{r.system}: every request produced exactly its requested tokens")
            lines += [f"  {n}" for n in r.notes]
        return lines

    def _floor_lines(self) -> list[str]:
        m, w, f = self.model_cost, self.workload_cost, self.floor
        if m is None or w is None or f is None:
            return ["physical floor: not computed"]
        kv = f"{m.kv_bytes_per_token / _KIB:.1f} KiB"
        lines = [
            "physical floor (bytes and FLOPs any engine must spend; docs/benchmarks.md):",
            f"  weights    {_si(m.weight_bytes_per_step, 'B')} per pass x {w.min_steps:,} passes (the longest output)"
            f" = {_si(f.weight_bytes, 'B')}",
            f"  KV reads   {w.kv_token_reads:,} token-reads x {kv} = {_si(f.kv_read_bytes, 'B')}",
            f"  KV writes  {w.tokens_fed:,} tokens x {kv} = {_si(f.kv_write_bytes, 'B')}",
            f"  total      {_si(f.total_bytes, 'B')}; {_si(f.flops, 'FLOP')}",
        ]
        if self.limits is None:
            lines.append(f"  device limits not measured on {self.device}: floor time not computed")
            return lines
        lines += [
            f"  device     {self.limits.describe()}",
            f"  memory {f.memory_time_s:.2f} s, compute {f.compute_time_s:.2f} s: floor {f.floor_time_s:.2f} s "
            f"({f.bound}-bound), ceiling {f.ceiling_output_tok_s:,.0f} output tok/s",
        ]
        fraction = self.floor_fraction()
        if fraction is not None:
            lines.append(f"  folio reaches {100 * fraction:.1f}% of the ceiling")
        return lines


def _workload_dict(w: Workload) -> dict[str, Any]:
    return {
        "name": w.name,
        "num_requests": w.num_requests,
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
    }


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from folio.version import __version__

    return {
        "folio": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _ratio(value: float | None) -> str:
    return f"{value:.1f}×" if value is not None else "n/a"


def _si(value: float, unit: str) -> str:
    """1.23 TB, 456.7 GFLOP: decimal prefixes, as bandwidths and FLOP rates are quoted."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _kv(d: dict[str, Any], prefix: str = "") -> str:
    """k=v pairs; nested dicts (e.g. a KV-waste record inside the engine stats) as outer.inner=v."""
    parts = []
    for k, v in d.items():
        if isinstance(v, dict):
            parts.append(_kv(v, f"{prefix}{k}."))
        else:
            parts.append(f"{prefix}{k}={v:.3f}" if isinstance(v, float) else f"{prefix}{k}={v}")
    return ", ".join(p for p in parts if p)
