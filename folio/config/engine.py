"""EngineConfig: all the per-concern configs of one engine, checked against each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.config.cache import CacheConfig
from folio.config.device import DeviceConfig, ParallelConfig
from folio.config.lora import LoRAConfig
from folio.config.model import ModelConfig
from folio.config.scheduler import SchedulerConfig
from folio.config.structured_outputs import StructuredOutputsConfig


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: DeviceConfig
    parallel: ParallelConfig
    lora: LoRAConfig | None = None  # None: LoRA off (enable_lora=False)
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)

    def __post_init__(self) -> None:
        if self.scheduler.max_model_len != self.model.max_model_len:
            raise ValueError("scheduler and model disagree on max_model_len.")
