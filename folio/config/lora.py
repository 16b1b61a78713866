"""LoRAConfig: how many adapters a step may mix, their largest rank, and how many stay on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

# Ranks the kernels take (folio/kernels/lora_expand.py: up to 128; shrink stacks 3 shards).
MAX_SUPPORTED_RANK = 64


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 1  # GPU slots: distinct adapters one step may use
    max_lora_rank: int = 16  # every slot is padded to this rank (static shapes for CUDA graphs)
    max_cpu_loras: int | None = None  # adapters kept loaded on the CPU (LRU); None: max_loras

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.max_lora_rank > MAX_SUPPORTED_RANK:
            raise ValueError(f"max_lora_rank up to {MAX_SUPPORTED_RANK} is supported, got {self.max_lora_rank}.")
        cpu = self.max_cpu_loras
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < self.max_loras):
            raise ValueError(f"max_cpu_loras must be an integer >= max_loras ({self.max_loras}), got {cpu!r}.")

    @property
    def cpu_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
