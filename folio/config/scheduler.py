"""SchedulerConfig: the token budget, concurrency, ordering and preemption policy."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("fcfs", "priority")
PREEMPTION_MODES = (None, "recompute", "swap")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # requests running at once
    max_num_batched_tokens: int = 8192  # tokens computed in one step (prefill chunks + decodes)
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    preemption_mode: str | None = None  # None: the scheduler chooses (see core/scheduler)
    # Plan and launch step N+1 while step N runs on the device (engine/llm_engine.py).
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.policy not in POLICIES:
            raise ValueError(f"scheduling policy must be one of {POLICIES}, got {self.policy!r}.")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be 'recompute', 'swap' or None, got {self.preemption_mode!r}."
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill off: a long prompt "
                "could never be scheduled. Raise max_num_batched_tokens or enable chunked prefill."
            )
