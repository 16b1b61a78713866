"""Frozen configuration dataclasses, one per concern, validated once at construction."""

from folio.config.cache import CacheConfig
from folio.config.device import DeviceConfig, ParallelConfig, resolve_device
from folio.config.engine import EngineConfig
from folio.config.lora import LoRAConfig
from folio.config.model import ModelConfig
from folio.config.scheduler import SchedulerConfig
from folio.config.structured_outputs import StructuredOutputsConfig
from folio.config.speculative import SpeculativeConfig

__all__ = [
    "CacheConfig",
    "DeviceConfig",
    "EngineConfig",
    "LoRAConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "StructuredOutputsConfig",
    "SpeculativeConfig",
    "resolve_device",
]
