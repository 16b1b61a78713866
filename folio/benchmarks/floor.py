"""The physical floor: the least time any engine needs for a workload on a model and a device.

Bytes that must cross device memory, and FLOPs that must be done, each over what the device was
measured to do (`hardware.DeviceLimits`); the floor time is the larger of the two, and the
ceiling throughput is the workload's output tokens over it.

Counting rules (docs/benchmarks.md states them for users):
- Weights: every parameter a forward pass multiplies by (all linear layers, lm_head included,
  even when tied to the embeddings) and every norm scale, read once per forward pass. Embedding
  tables are gathered row by row, not read whole, so they do not count. A request's output tokens
  come from that many *sequential* forward passes, so the workload needs at least
  max(output_len) passes: weights are read at least that many times. (This is the schedule where
  every request is resident from the start; any other schedule has more passes.)
- KV cache reads: output token k of a request (k = 1..O) is sampled from a pass whose context
  is prompt + k - 1 tokens, and that pass reads the K/V of the whole context over all layers
  (capped at the sliding window where the model has one). Summed over W1 on Qwen3-0.6B this is
  ~121 M token-reads of 112 KiB: ~14 TB.
- KV cache writes: every token fed to the model (prompt + output - 1) is written once.
- FLOPs: 2 x (non-lm_head matmul params) per token fed, 2 x (lm_head params) per token sampled,
  and attention: 4 x heads x head_dim per (query, key) pair per layer (QK^T and PV), where
  every fed token attends to itself and all tokens before it.
- Quantized runs (`weight_format`): the decoder's linear weights at the bytes folio's kernels
  read (FP8: 1; 4-bit: 0.5 plus a float32 scale a group, and a one-byte zero point when
  asymmetric), lm_head and norms at the model dtype, the K/V at 1 byte with an FP8 cache. FP8
  W8A8 products count at twice the 16-bit matrix rate (Hopper's FP8 tensor cores), W4A16 ones
  at the 16-bit rate (they dequantize and multiply in 16 bits).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from folio.benchmarks.hardware import DeviceLimits
from folio.benchmarks.workloads import Workload

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# What the W4A16 kernels read a group besides the weights (layers/quantization/w4a16.py): a
# float32 scale, and a uint8 zero point when the checkpoint is asymmetric.
_SCALE_BYTES = 4
_ZERO_BYTES = 1
_BODY_LAYER = "model.layers.0.mlp.down_proj"  # a decoder linear layer: the method most of them get


@dataclass(frozen=True)
class ModelCost:
    """What one forward pass of a model costs, independent of the workload."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    itemsize: int  # bytes per weight (lm_head, norms, unquantized linears) and per KV element
    step_params: int  # parameters read by every forward pass (linears, lm_head, norms)
    body_matmul_params: int  # linear-layer weights other than lm_head: 2 FLOPs each per token fed
    lm_head_params: int  # 2 FLOPs each per token sampled
    sliding_window: int | None = None
    body_weight_bytes: float | None = None  # bytes a non-lm_head linear weight takes; None: itemsize
    kv_itemsize: int | None = None  # bytes per cached K/V element; None: itemsize
    fp8_matmuls: bool = False  # the non-lm_head linears run on FP8 tensor cores (twice the rate)

    @property
    def weight_bytes_per_step(self) -> int:
        body = self.itemsize if self.body_weight_bytes is None else self.body_weight_bytes
        return round(self.body_matmul_params * body + (self.step_params - self.body_matmul_params) * self.itemsize)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * (self.kv_itemsize or self.itemsize)

    @property
    def attention_flops_per_pair(self) -> int:
        return 4 * self.num_heads * self.head_dim * self.num_layers


@dataclass(frozen=True)
class WorkloadCost:
    """Token counts of a workload that the floor multiplies by a model's per-token costs."""

    min_steps: int  # sequential forward passes at the least: the longest output
    tokens_fed: int  # prompt + output - 1 per request
    tokens_sampled: int  # the output tokens
    kv_token_reads: int  # tokens of context read to sample each output token
    attention_pairs: int  # (query, key) pairs over all fed tokens


@dataclass(frozen=True)
class Floor:
    weight_bytes: int
    kv_read_bytes: int
    kv_write_bytes: int
    flops: int
    output_tokens: int
    device: DeviceLimits | None
    fp8_flops: int = 0  # the part of flops on FP8 tensor cores, at twice the measured 16-bit rate

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def memory_time_s(self) -> float | None:
        return self.total_bytes / self.device.copy_bandwidth if self.device else None

    @property
    def compute_time_s(self) -> float | None:
        return (self.flops - self.fp8_flops / 2) / self.device.matmul_flops if self.device else None

    @property
    def floor_time_s(self) -> float | None:
        if self.device is None:
            return None
        return max(self.memory_time_s, self.compute_time_s)  # type: ignore[type-var]

    @property
    def bound(self) -> str | None:
        if self.device is None:
            return None
        return "memory" if self.memory_time_s >= self.compute_time_s else "compute"  # type: ignore[operator]

    @property
    def ceiling_output_tok_s(self) -> float | None:
        t = self.floor_time_s
        return self.output_tokens / t if t else None

    def fraction(self, output_tok_s: float) -> float | None:
        """How much of the ceiling a measured output throughput reaches."""
        ceiling = self.ceiling_output_tok_s
        return output_tok_s / ceiling if ceiling else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_bytes": self.weight_bytes,
            "kv_read_bytes": self.kv_read_bytes,
            "kv_write_bytes": self.kv_write_bytes,
            "total_bytes": self.total_bytes,
            "flops": self.flops,
            "fp8_flops": self.fp8_flops,
            "memory_time_s": self.memory_time_s,
            "compute_time_s": self.compute_time_s,
            "floor_time_s": self.floor_time_s,
            "bound": self.bound,
            "ceiling_output_tok_s": self.ceiling_output_tok_s,
        }


# ---- model ---------------------------------------------------------------------------------
def model_cost(model_path: str, dtype: str, quantization: str | None = None, kv_cache_dtype: str = "auto") -> ModelCost:
    """Count a checkpoint's parameters by building its transformers model on the meta device;
    quantization (as LLM(quantization=...) takes it, or the checkpoint's own) and kv_cache_dtype
    set the bytes of its linear weights and of its cache (weight_format)."""
    import torch
    import transformers

    if dtype not in _ITEMSIZE:
        raise ValueError(f"dtype must be one of {sorted(_ITEMSIZE)}, got {dtype!r}.")
    config = transformers.AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    step, body, lm_head = _count_params(model)
    text = config.get_text_config()
    hf = _read_config(model_path)
    heads = int(text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or int(text.hidden_size) // heads
    return ModelCost(
        num_layers=int(text.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        itemsize=_ITEMSIZE[dtype],
        step_params=step,
        body_matmul_params=body,
        lm_head_params=lm_head,
        sliding_window=_sliding_window(hf),
        **weight_format(quantization, hf),
        kv_itemsize=1 if kv_cache_dtype.startswith("fp8") else None,
    )


def weight_format(quantization: str | None, hf: dict[str, Any]) -> dict[str, Any]:
    """ModelCost's body_weight_bytes and fp8_matmuls for what folio would run: the scheme
    (resolve_quantization's rules) as the loader builds it, asked for a decoder layer's method.
    Layers a checkpoint leaves unquantized count as that layer: the floor errs low by their share."""
    from folio.config.model import resolve_quantization
    from folio.layers.quantization import build_quantization_config
    from folio.layers.quantization.fp8 import Fp8LinearMethod
    from folio.layers.quantization.w4a16 import W4A16LinearMethod

    name = resolve_quantization(quantization, hf)
    if name is None:
        return {}
    method = build_quantization_config(name, hf.get("quantization_config") or {}).get_linear_method(_BODY_LAYER)
    if isinstance(method, Fp8LinearMethod):
        return {"body_weight_bytes": 1.0, "fp8_matmuls": True}
    if isinstance(method, W4A16LinearMethod):
        per_group = _SCALE_BYTES + (0 if method.symmetric else _ZERO_BYTES)
        return {"body_weight_bytes": 0.5 + (per_group / method.group_size if method.group_size > 0 else 0.0)}
    return {}


def _count_params(model: Any) -> tuple[int, int, int]:
    """(params read per pass, non-lm_head linear weights, lm_head weights) of a transformers model."""
    import torch

    output = model.get_output_embeddings()
    linear_ids: set[int] = set()
    embedding_ids: set[int] = set()
    body = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            linear_ids.update(id(p) for p in module.parameters(recurse=False))
            if module is not output:
                body += module.weight.numel()
        elif isinstance(module, torch.nn.Embedding):
            embedding_ids.update(id(p) for p in module.parameters(recurse=False))
    seen: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            seen[id(p)] = p.numel()
    # Tied lm_head: its weight is an Embedding's parameter too, but a pass reads it whole.
    step = sum(n for pid, n in seen.items() if pid in linear_ids or pid not in embedding_ids)
    lm_head = output.weight.numel() if output is not None else 0
    return step, body, lm_head


def _read_config(model_path: str) -> dict[str, Any]:
    with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _sliding_window(hf: dict[str, Any]) -> int | None:
    """The window every layer uses, or None. (Qwen2's window on some layers only: not capped.)"""
    window = hf.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or hf.get("use_sliding_window") is False:
        return None
    if hf.get("model_type") == "qwen2" and hf.get("max_window_layers", 0) > 0:
        return None
    return window


# ---- workload ------------------------------------------------------------------------------
def workload_cost(workload: Workload, sliding_window: int | None = None) -> WorkloadCost:
    reads = pairs = fed = 0
    for r in workload.requests:
        p, o = r.prompt_len, r.output_len
        reads += _sum_contexts(p, p + o - 1, sliding_window)  # contexts p .. p+o-1
        pairs += _sum_contexts(1, p + o - 1, sliding_window)  # fed token t attends to t tokens
        fed += p + o - 1
    return WorkloadCost(
        min_steps=max((r.output_len for r in workload.requests), default=0),
        tokens_fed=fed,
        tokens_sampled=workload.output_tokens,
        kv_token_reads=reads,
        attention_pairs=pairs,
    )


def _sum_contexts(first: int, last: int, window: int | None) -> int:
    """sum(min(c, window) for c in first..last), in closed form."""
    if last < first:
        return 0
    if window is None or last <= window:
        return (first + last) * (last - first + 1) // 2
    if first > window:
        return window * (last - first + 1)
    return (first + window) * (window - first + 1) // 2 + window * (last - window)


# ---- floor ---------------------------------------------------------------------------------
def compute_floor(model: ModelCost, work: WorkloadCost, device: DeviceLimits | None) -> Floor:
    flops = (
        2 * model.body_matmul_params * work.tokens_fed
        + 2 * model.lm_head_params * work.tokens_sampled
        + model.attention_flops_per_pair * work.attention_pairs
    )
    fp8 = 2 * model.body_matmul_params * work.tokens_fed if model.fp8_matmuls else 0
    return Floor(
        weight_bytes=model.weight_bytes_per_step * work.min_steps,
        kv_read_bytes=model.kv_bytes_per_token * work.kv_token_reads,
        kv_write_bytes=model.kv_bytes_per_token * work.tokens_fed,
        flops=flops,
        output_tokens=work.tokens_sampled,
        device=device,
        fp8_flops=fp8,
    )
