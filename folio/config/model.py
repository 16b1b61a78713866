"""ModelConfig: which checkpoint, its architecture and shapes, dtype and context length."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

_DTYPE_ALIASES = {
    "half": "float16",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "fp32": "float32",
}
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
# quantization= names: read from a checkpoint's quantization_config, or applied on load (ONLINE).
SERIALIZED_QUANTIZATIONS = ("compressed-tensors", "gptq", "awq")
ONLINE_QUANTIZATIONS = ("fp8", "int4-rtn")  # int4-rtn: round-to-nearest W4A16, for benchmarks
QUANTIZATIONS = SERIALIZED_QUANTIZATIONS + ONLINE_QUANTIZATIONS
_QUANTIZATION_ALIASES = {"compressed_tensors": "compressed-tensors", "gptq_marlin": "gptq", "awq_marlin": "awq"}
# Keys that different architectures use for their trained context length, in order of trust.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "model_max_length",
)


@dataclass(frozen=True)
class ModelConfig:
    model: str  # a local checkpoint folder (hub ids are resolved to one before this)
    tokenizer: str
    served_model_name: str
    hf_config: dict[str, Any] = field(repr=False, hash=False, compare=False)
    architecture: str
    dtype: str  # resolved: "float32", "bfloat16" or "float16"
    max_model_len: int
    seed: int = 0
    load_format: str = "auto"
    enforce_eager: bool = False
    attention_backend: str = "auto"  # "auto", "torch" or "triton"
    generation_config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    quantization: str | None = None  # resolved by resolve_quantization; None: unquantized

    @property
    def quantization_config(self) -> dict[str, Any]:
        """The checkpoint's quantization_config ({} when it has none)."""
        raw = self.hf_config.get("quantization_config")
        return raw if isinstance(raw, dict) else {}

    # ---- shapes the engine needs without building the model ------------------------------
    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.hf_config["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        kv = self.hf_config.get("num_key_value_heads")
        return int(kv) if kv else self.num_attention_heads

    @property
    def head_dim(self) -> int:
        hd = self.hf_config.get("head_dim")
        if hd:
            return int(hd)
        return int(self.hf_config["hidden_size"]) // self.num_attention_heads

    @property
    def hidden_size(self) -> int:
        return int(self.hf_config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V that one token occupies over all layers."""
        itemsize = 4 if self.dtype == "float32" else 2
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        model: str,
        *,
        tokenizer: str | None = None,
        served_model_name: str | None = None,
        dtype: str = "auto",
        device: str = "cpu",
        max_model_len: int | None = None,
        seed: int = 0,
        load_format: str = "auto",
        enforce_eager: bool = False,
        attention_backend: str = "auto",
        quantization: str | None = None,
    ) -> ModelConfig:
        """Read `model`/config.json and resolve dtype and context length, or raise ValueError."""
        hf_config = load_hf_config(model)
        archs = hf_config.get("architectures") or []
        if not archs:
            raise ValueError(f"{model}/config.json names no 'architectures'.")
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}.")
        if attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be 'auto', 'torch' or 'triton', got {attention_backend!r}."
            )
        return cls(
            model=model,
            tokenizer=tokenizer or model,
            served_model_name=served_model_name or model,
            hf_config=hf_config,
            architecture=archs[0],
            dtype=resolve_dtype(dtype, hf_config, device),
            max_model_len=resolve_max_model_len(max_model_len, hf_config),
            seed=seed,
            load_format=load_format,
            enforce_eager=enforce_eager,
            attention_backend=attention_backend,
            generation_config=load_generation_config(model),
            quantization=resolve_quantization(quantization, hf_config),
        )


def resolve_quantization(requested: str | None, hf_config: dict[str, Any]) -> str | None:
    """The scheme to run: the checkpoint's quant_method, or the requested one, or ValueError.

    A request must agree with a quantized checkpoint; a serialized scheme needs a checkpoint
    that carries it; fp8 and int4-rtn quantize an unquantized checkpoint on load.
    """
    raw = hf_config.get("quantization_config")
    method = raw.get("quant_method") if isinstance(raw, dict) else None
    stored = _QUANTIZATION_ALIASES.get(str(method), str(method)) if method else None
    wanted = _QUANTIZATION_ALIASES.get(requested, requested) if requested else None
    if wanted is not None and wanted not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {requested!r}.")
    if stored is not None and stored not in SERIALIZED_QUANTIZATIONS:
        raise ValueError(
            f"The checkpoint's quantization_config has quant_method {method!r}, which folio "
            f"cannot load; supported: {SERIALIZED_QUANTIZATIONS}."
        )
    if stored is not None and wanted not in (None, stored):
        raise ValueError(
            f"quantization={requested!r} does not match the checkpoint, which is quantized "
            f"with {stored!r}."
        )
    if stored is None and wanted in SERIALIZED_QUANTIZATIONS:
        raise ValueError(
            f"quantization={requested!r} needs a checkpoint with a quantization_config; this "
            f"one has none (to quantize on load use one of {ONLINE_QUANTIZATIONS})."
        )
    return stored or wanted


def load_hf_config(model: str) -> dict[str, Any]:
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"No config.json in {model!r}: pass a Hugging Face checkpoint folder "
            "(config.json + *.safetensors + tokenizer files)."
        )
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object.")
    # Multimodal wrappers keep the language model under text_config; we serve that part.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        text = dict(config["text_config"])
        text.setdefault("architectures", config.get("architectures"))
        config = text
    return config


def load_generation_config(model: str) -> dict[str, Any]:
    path = os.path.join(model, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError:
            return {}
    return data if isinstance(data, dict) else {}


def checkpoint_dtype(hf_config: dict[str, Any]) -> str | None:
    raw = hf_config.get("dtype") or hf_config.get("torch_dtype")
    if isinstance(raw, str):
        return _DTYPE_ALIASES.get(raw.removeprefix("torch."))
    return None


def resolve_dtype(dtype: str, hf_config: dict[str, Any], device: str) -> str:
    """'auto' keeps the checkpoint's dtype on a GPU (fp32 becomes bf16) and is fp32 on the CPU."""
    if dtype == "auto":
        if device == "cpu":
            return "float32"
        ckpt = checkpoint_dtype(hf_config) or "bfloat16"
        return "bfloat16" if ckpt == "float32" else ckpt
    resolved = _DTYPE_ALIASES.get(str(dtype).removeprefix("torch."))
    if resolved is None:
        raise ValueError(
            f"dtype must be 'auto' or one of {sorted(set(_DTYPE_ALIASES))}, got {dtype!r}."
        )
    return resolved


def derived_max_model_len(hf_config: dict[str, Any]) -> int:
    for key in _MAX_LEN_KEYS:
        value = hf_config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def resolve_max_model_len(requested: int | None, hf_config: dict[str, Any]) -> int:
    derived = derived_max_model_len(hf_config)
    if requested is None:
        return derived
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"max_model_len must be a positive integer, got {requested!r}.")
    if requested > derived:
        raise ValueError(
            f"max_model_len={requested} is longer than the model's trained context "
            f"({derived} tokens, from config.json)."
        )
    return requested
