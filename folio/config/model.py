"""ModelConfig: which checkpoint, its architecture and shapes, dtype and context length."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from folio.config.generation import resolve_generation_config
from folio.config.hf_config import apply_hf_overrides, check_model_sizes, load_hf_config
from folio.pooling_params import PoolerConfig

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
# What torch.Generator.manual_seed takes: a seed beyond it failed at start with "Overflow when
# unpacking long long", naming no argument (SamplingParams.seed has the same bounds).
SEED_RANGE = (-(2**63), 2**64 - 1)
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
    skip_tokenizer_init: bool = False  # no tokenizer: token ids in, token ids out
    pooler_config: Any = None  # pooling_params.PoolerConfig: embeddings' default pooling
    quantization: str | None = None  # resolved by resolve_quantization; None: unquantized

    def __post_init__(self) -> None:
        low, high = SEED_RANGE
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not low <= self.seed <= high:
            raise ValueError(f"seed (--seed) must be an integer that fits in 64 bits ({low} to {high}), "
                             f"got {self.seed!r}.")

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
        skip_tokenizer_init: bool = False,
        hf_overrides: dict[str, Any] | None = None,
        generation_config_source: str = "auto",
        override_generation_config: dict[str, Any] | None = None,
        pooler_config: dict[str, Any] | None = None,
        quantization: str | None = None,
    ) -> ModelConfig:
        """Read `model`/config.json and resolve dtype and context length, or raise ValueError."""
        hf_config = apply_hf_overrides(load_hf_config(model), hf_overrides)
        check_model_sizes(model, hf_config, hf_overrides)
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
            generation_config=resolve_generation_config(
                model, generation_config_source, override_generation_config
            ),
            skip_tokenizer_init=bool(skip_tokenizer_init),
            pooler_config=PoolerConfig.from_dict(pooler_config),
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
