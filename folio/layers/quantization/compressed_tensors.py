"""Checkpoints written by compressed-tensors / llm-compressor: which scheme each layer has.

The quantization_config lists config_groups (targets -> weight and activation arguments), an
`ignore` list and a format. Targets and ignore entries are module names, class names ("Linear")
or regexes ("re:.*down_proj"), matched against the checkpoint's module names; a fused layer
(qkv_proj) must resolve to one scheme for all its shards. Supported schemes: FP8 W8A8
(float-quantized: FP8_DYNAMIC, FP8) and INT4 weight-only (pack-quantized W4A16, group or
channel); any other is an error that names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from folio.layers.quantization.base import (
    LinearMethod,
    QuantizationConfig,
    UnquantizedLinearMethod,
    checkpoint_prefixes,
)
from folio.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class Scheme:
    """One config group: what its weights and input activations are quantized to."""

    group: str
    targets: tuple[str, ...]
    weights: dict[str, Any]
    input_activations: dict[str, Any] | None
    format: str

    def describe(self) -> str:
        def args(a: dict[str, Any] | None) -> str:
            if not a:
                return "none"
            dyn = "dynamic" if a.get("dynamic") else "static"
            group = f", group {a.get('group_size')}" if a.get("group_size") else ""
            return f"{a.get('type')}{a.get('num_bits')} {a.get('strategy')} {dyn}{group}"

        return (
            f"group {self.group!r} (format {self.format!r}; weights {args(self.weights)}; "
            f"input activations {args(self.input_activations)})"
        )


def _matches(name: str, patterns: tuple[str, ...] | list[str]) -> bool:
    for pattern in patterns:
        if pattern == "Linear" or pattern == name:
            return True
        if pattern.startswith("re:") and re.match(pattern[3:], name):
            return True
    return False


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    def __init__(self, schemes: list[Scheme], ignore: list[str], kv_cache_scheme: dict | None) -> None:
        self.schemes = schemes
        self.ignore = ignore
        self.kv_cache_scheme = kv_cache_scheme

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        default_format = str(config.get("format") or "dense")
        groups = config.get("config_groups") or {}
        if not isinstance(groups, dict) or not groups:
            raise ValueError("compressed-tensors quantization_config has no config_groups.")
        schemes = [
            Scheme(
                group=str(name),
                targets=tuple(group.get("targets") or ()),
                weights=dict(group.get("weights") or {}),
                input_activations=group.get("input_activations"),
                format=str(group.get("format") or default_format),
            )
            for name, group in groups.items()
        ]
        for scheme in schemes:
            method_for(scheme)  # an unsupported scheme fails at load, not at the first forward
        return cls(schemes, list(config.get("ignore") or []), config.get("kv_cache_scheme"))

    def get_linear_method(self, prefix: str) -> LinearMethod:
        chosen = {name: self._scheme_for(name) for name in checkpoint_prefixes(prefix)}
        first = next(iter(chosen.values()))
        if any(scheme is not first for scheme in chosen.values()):
            described = {k: (v.group if v else "unquantized") for k, v in chosen.items()}
            raise ValueError(
                f"The shards of {prefix} are quantized differently ({described}); folio fuses "
                "them into one matmul and needs one scheme."
            )
        return UnquantizedLinearMethod() if first is None else method_for(first)

    def _scheme_for(self, name: str) -> Scheme | None:
        if _matches(name, self.ignore):
            return None
        for scheme in self.schemes:
            if _matches(name, scheme.targets):
                return scheme
        return None

    def kv_cache_scales(self) -> bool:
        return bool(self.kv_cache_scheme)


def method_for(scheme: Scheme) -> LinearMethod:
    """The LinearMethod for one scheme, or ValueError naming what folio cannot run."""
    w, a = scheme.weights, scheme.input_activations
    if _is_fp8(w) and a is not None and _is_fp8(a) and w.get("strategy") in ("channel", "tensor"):
        from folio.layers.quantization.fp8 import Fp8LinearMethod

        per_token = a.get("dynamic") is True and a.get("strategy") == "token"
        static = not a.get("dynamic") and a.get("strategy") == "tensor"
        if per_token or static:
            return Fp8LinearMethod(True, w["strategy"], static_input_scale=static)
    if (
        scheme.format == "pack-quantized"
        and w.get("type") == "int"
        and w.get("num_bits") == 4
        and a is None
        and w.get("strategy") in ("group", "channel")
        and w.get("actorder") in (None, False, "group", "weight", "static")  # static: weight's alias
    ):
        from folio.layers.quantization.w4a16 import W4A16LinearMethod

        group_size = int(w["group_size"]) if w.get("strategy") == "group" else -1
        return W4A16LinearMethod("compressed-tensors", group_size, bool(w.get("symmetric", True)),
                                 desc_act=w.get("actorder") == "group")
    raise ValueError(
        f"Unsupported compressed-tensors scheme: {scheme.describe()}. folio runs FP8 W8A8 "
        "(float8 weights per channel or tensor, activations per token dynamic or per tensor "
        "static) and INT4 weight-only pack-quantized (group or channel)."
    )


def _is_fp8(args: dict[str, Any]) -> bool:
    return args.get("type") == "float" and args.get("num_bits") == 8
