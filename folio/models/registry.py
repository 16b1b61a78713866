"""Architecture name (config.json "architectures"[0]) -> model class."""

from __future__ import annotations

import importlib

from folio.models.base import CausalLM

# Modules are imported on first use so that importing the registry stays cheap.
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("folio.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("folio.models.mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("folio.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("folio.models.qwen3", "Qwen3ForCausalLM"),
    "OPTForCausalLM": ("folio.models.opt", "OPTForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[CausalLM]:
    if architecture not in _MODELS:
        raise ValueError(
            f"Unsupported architecture {architecture!r}; folio supports: "
            f"{', '.join(supported_architectures())}."
        )
    module_name, class_name = _MODELS[architecture]
    return getattr(importlib.import_module(module_name), class_name)
