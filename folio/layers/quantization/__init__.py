"""Quantization schemes: the model's QuantizationConfig from a ModelConfig, and its log summary.

The scheme name comes resolved from ModelConfig.quantization (the checkpoint's quant_method or
the `quantization` argument); each name maps to one QuantizationConfig class, imported on use.
"""

from __future__ import annotations

import importlib
from collections import Counter

from torch import nn

from folio.config.model import ModelConfig
from folio.layers.quantization.base import LinearMethod, QuantizationConfig

# name -> (module, class); each class has from_config(quantization_config: dict).
_CONFIGS: dict[str, tuple[str, str]] = {
    "fp8": ("folio.layers.quantization.fp8", "Fp8Config"),
    "compressed-tensors": ("folio.layers.quantization.compressed_tensors", "CompressedTensorsConfig"),
    "gptq": ("folio.layers.quantization.int4", "GPTQConfig"),
    "awq": ("folio.layers.quantization.int4", "AWQConfig"),
    "int4-rtn": ("folio.layers.quantization.int4", "Int4RtnConfig"),
}


def get_quantization_config(model_config: ModelConfig) -> QuantizationConfig | None:
    """The model's scheme, built once from the checkpoint's quantization_config; None: none."""
    name = model_config.quantization
    if name is None:
        return None
    return build_quantization_config(name, model_config.quantization_config)


def build_quantization_config(name: str, quantization_config: dict) -> QuantizationConfig:
    """The scheme `name` (a resolved ModelConfig.quantization) from a quantization_config."""
    if name not in _CONFIGS:
        raise ValueError(f"Quantization {name!r} is not implemented yet.")
    module_name, class_name = _CONFIGS[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls.from_config(quantization_config)


def linear_methods(model: nn.Module) -> list[tuple[nn.Module, LinearMethod]]:
    """(layer, method) for every linear layer of `model`, in module order."""
    return [
        (module, module.quant_method)
        for module in model.modules()
        if isinstance(getattr(module, "quant_method", None), LinearMethod)
    ]


def process_weights_after_loading(model: nn.Module) -> str:
    """Let each layer's method repack what it loaded; return "method x count, ..." for the log."""
    counts: Counter[str] = Counter()
    for layer, method in linear_methods(model):
        method.process_weights_after_loading(layer)
        counts[method.name] += 1
    return ", ".join(f"{name} x {count}" for name, count in sorted(counts.items()))
