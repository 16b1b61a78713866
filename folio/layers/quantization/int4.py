"""Which INT4 checkpoints folio reads: GPTQ (AutoGPTQ / GPTQModel) and AWQ (AutoAWQ GEMM)
quantization_configs, and `int4-rtn`, which rounds an unquantized checkpoint to INT4 on load
(symmetric, group 128; for benchmarks of the real architecture with dummy weights).
"""

from __future__ import annotations

from typing import Any

from folio.layers.quantization.base import (
    LinearMethod,
    QuantizationConfig,
    UnquantizedLinearMethod,
    checkpoint_prefixes,
)
from folio.layers.quantization.w4a16 import W4A16LinearMethod

RTN_GROUP_SIZE = 128


def _bits4(method: str, config: dict[str, Any]) -> int:
    bits = int(config.get("bits", config.get("w_bit", 4)))
    if bits != 4:
        raise ValueError(f"{method} with {bits}-bit weights is not supported; folio runs 4-bit only.")
    group = int(config.get("group_size", config.get("q_group_size", 128)))
    if group != -1 and (group <= 0 or group % 32):
        raise ValueError(f"{method} group_size {group} is not supported; use -1 or a multiple of 32.")
    return group


class _Int4Config(QuantizationConfig):
    def __init__(self, method: W4A16LinearMethod, skip: list[str]) -> None:
        self.method = method
        self.skip = skip

    def get_linear_method(self, prefix: str) -> LinearMethod:
        names = checkpoint_prefixes(prefix)
        if any(s in name for s in self.skip for name in names):
            return UnquantizedLinearMethod()
        return self.method


class GPTQConfig(_Int4Config):
    name = "gptq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GPTQConfig:
        group = _bits4("gptq", config)
        fmt = str(config.get("checkpoint_format") or "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported; folio reads 'gptq' and 'gptq_v2'.")
        if config.get("dynamic"):
            raise ValueError("GPTQ with per-module 'dynamic' overrides is not supported.")
        sym = bool(config.get("sym", True))
        method = W4A16LinearMethod(fmt, group, sym, desc_act=bool(config.get("desc_act", False)))
        return cls(method, list(config.get("modules_to_not_convert") or []))


class AWQConfig(_Int4Config):
    name = "awq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AWQConfig:
        group = _bits4("awq", config)
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r} is not supported; folio reads the 'gemm' layout.")
        sym = not bool(config.get("zero_point", True))
        method = W4A16LinearMethod("awq", group, sym)
        return cls(method, list(config.get("modules_to_not_convert") or []))


class Int4RtnConfig(_Int4Config):
    name = "int4-rtn"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Int4RtnConfig:
        return cls(W4A16LinearMethod("rtn", RTN_GROUP_SIZE, True), [])
