"""EngineConfig: all the per-concern configs of one engine, checked against each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.config.cache import CacheConfig
from folio.config.device import DeviceConfig, ParallelConfig
from folio.config.lora import LoRAConfig
from folio.config.model import ModelConfig
from folio.config.scheduler import SchedulerConfig
from folio.config.structured_outputs import StructuredOutputsConfig
from folio.config.speculative import SpeculativeConfig


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

    def _check_draft(self) -> None:
        wants_draft = self.speculative is not None and self.speculative.method == "draft_model"
        if wants_draft != (self.draft_model is not None):
            raise ValueError("A draft model goes with speculative method 'draft_model', and only with it.")
        if self.draft_model is not None and self.draft_model.vocab_size != self.model.vocab_size:
            raise ValueError(
                f"The draft model's vocabulary ({self.draft_model.vocab_size} tokens) differs from the "
                f"target's ({self.model.vocab_size}): speculative decoding needs the same tokenizer."
            )
