"""LoRARequest: which adapter a request runs with (vLLM's class and field names).

Torch-free: the scheduler (folio/core/) reads `lora_int_id` to bound the adapters of one step,
and the block hash mixes the adapter into the prefix-cache key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, positive integer id (unique per adapter while the engine runs) and
    the local folder PEFT saved it to (adapter_config.json + adapter_model.safetensors)."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None  # informational, as in vLLM

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}.")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}.")
        if not isinstance(self.lora_path, (str, os.PathLike)) or not str(self.lora_path):
            raise ValueError(f"lora_path must name the adapter's folder, got {self.lora_path!r}.")
        object.__setattr__(self, "lora_path", os.fspath(self.lora_path))

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def cache_key(self) -> bytes:
        """What the prefix cache mixes into a request's first block: K/V computed under one
        adapter are never reused under another (nor under the base model)."""
        return f"lora:{self.lora_int_id}:{self.lora_name}:{self.lora_path}".encode()
