"""EngineConfig: all the per-concern configs of one engine, checked against each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.config.cache import CacheConfig
from folio.config.device import DeviceConfig, ParallelConfig
from folio.config.lora import LoRAConfig
from folio.config.model import ModelConfig
from folio.config.scheduler import SchedulerConfig
from folio.config.memory import check_host_memory
from folio.config.structured_outputs import StructuredOutputsConfig
from folio.config.speculative import SpeculativeConfig
from folio.logger import init_logger

logger = init_logger(__name__)
# Warnings already given in this process: the CLI and the engine may build the config twice.
_WARNED: set[str] = set()


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: DeviceConfig
    parallel: ParallelConfig
    lora: LoRAConfig | None = None  # None: LoRA off (enable_lora=False)
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    speculative: SpeculativeConfig | None = None
    # The draft model of speculative method "draft_model" (its dtype and context follow the target's).
    draft_model: ModelConfig | None = None

    def __post_init__(self) -> None:
        if self.scheduler.max_model_len != self.model.max_model_len:
            raise ValueError("scheduler and model disagree on max_model_len.")
        self._check_draft()
        check_host_memory(self)
        self._warn_ignored_flags()

    def _check_draft(self) -> None:
        wants_draft = self.speculative is not None and self.speculative.method == "draft_model"
        if wants_draft != (self.draft_model is not None):
            raise ValueError("A draft model goes with speculative method 'draft_model', and only with it.")
        if self.draft_model is not None and self.draft_model.vocab_size != self.model.vocab_size:
            raise ValueError(
                f"The draft model's vocabulary ({self.draft_model.vocab_size} tokens) differs from the "
                f"target's ({self.model.vocab_size}): speculative decoding needs the same tokenizer."
            )

    def _warn_ignored_flags(self) -> None:
        """Flags accepted but meaningless in this setup: say so rather than ignore them silently."""
        default_utilization = CacheConfig.__dataclass_fields__["gpu_memory_utilization"].default
        if self.device.device == "cpu" and self.cache.gpu_memory_utilization != default_utilization:
            _warn_once(
                "gpu_memory_utilization (--gpu-memory-utilization) has no effect on the CPU: the KV cache "
                f"there is sized by cpu_kv_cache_space (--cpu-kv-cache-space, now {self.cache.cpu_kv_cache_space_gib:g} "
                "GiB) or num_gpu_blocks_override (--num-gpu-blocks-override)."
            )
        parallel = self.parallel
        if parallel.tensor_parallel_size == 1:
            for name in ("master_addr", "master_port"):
                if getattr(parallel, name) is not None:
                    flag = "--" + name.replace("_", "-")
                    _warn_once(f"{name} ({flag}) has no effect with tensor_parallel_size 1 (no ranks to "
                               "meet): ignored.")


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)
