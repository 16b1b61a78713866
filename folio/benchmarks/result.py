"""RunResult: one system's timed run of a workload, and what it produced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from folio.benchmarks.workloads import Workload


@dataclass(frozen=True)
class RunResult:
    system: str  # "folio", "transformers continuous batching", ...
    workload: str  # the workload's name; a subset says so, e.g. "w1[:32]"
    num_requests: int
    prompt_tokens: int
    output_tokens: int  # tokens actually produced, counted from the outputs
    elapsed_s: float
    # Requests whose output length differed from the requested one: index -> tokens produced.
    wrong_lengths: dict[int, int] = field(default_factory=dict)
    error: str | None = None  # set when the system failed; the numbers are then meaningless
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.wrong_lengths

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "workload": self.workload,
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "elapsed_s": self.elapsed_s,
            "requests_per_s": self.requests_per_s,
            "output_tok_s": self.output_tok_s,
            "total_tok_s": self.total_tok_s,
            "all_lengths_exact": not self.wrong_lengths,
            "wrong_lengths": {str(k): v for k, v in self.wrong_lengths.items()},
            "error": self.error,
            "notes": list(self.notes),
        }

    @classmethod
    def measured(
        cls, system: str, workload: Workload, produced: list[int], elapsed_s: float, *,
        prompt_tokens: int | None = None, **extra: Any,
    ) -> RunResult:
        """A timed run: `produced` holds each request's output length, in workload order."""
        return cls(
            system=system,
            workload=workload.name,
            num_requests=workload.num_requests,
            prompt_tokens=workload.prompt_tokens if prompt_tokens is None else prompt_tokens,
            output_tokens=sum(produced),
            elapsed_s=elapsed_s,
            wrong_lengths=wrong_lengths([r.output_len for r in workload.requests], produced),
            **extra,
        )

    @classmethod
    def failed(cls, system: str, workload: str, num_requests: int, error: str) -> RunResult:
        return cls(system, workload, num_requests, 0, 0, 0.0, error=error)


def wrong_lengths(wanted: list[int], produced: list[int]) -> dict[int, int]:
    """Index -> produced length for every request that did not produce exactly what it asked."""
    return {i: got for i, (want, got) in enumerate(zip(wanted, produced)) if got != want}
