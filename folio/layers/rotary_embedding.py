"""Rotary position embedding (neox style: the two halves of each head rotate together).

The cos/sin table is computed once in float32 for every position up to max_position and kept in
the model dtype, the same rounding transformers applies per step. Scaling types follow
transformers' definitions (modeling_rope_utils), the reference our logits are compared with.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from folio.kernels import qk_norm_rope as qk_norm_rope_kernel
from folio.kernels import rotary as rotary_kernel
from folio.kernels.triton_compat import use_triton_for

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_parameters_from_hf(
    hf_config: dict[str, Any], default_theta: float = 10000.0
) -> dict[str, Any]:
    """One flat dict {rope_type, rope_theta, ...scaling keys} from either config format.

    transformers >= 5 writes `rope_parameters`; older checkpoints carry `rope_theta` beside a
    `rope_scaling` dict (or null) whose type key may be spelled `type`.
    """
    raw = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"rope parameters must be a JSON object, got {raw!r}.")
    params = dict(raw)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    params.pop("type", None)
    params.setdefault("rope_theta", hf_config.get("rope_theta") or default_theta)
    if "partial_rotary_factor" in hf_config:
        params.setdefault("partial_rotary_factor", hf_config["partial_rotary_factor"])
    if params["rope_type"] in ("llama3", "yarn"):
        # A top-level original_max_position_embeddings wins, as in transformers.
        key = "original_max_position_embeddings"
        if hf_config.get(key):
            params[key] = hf_config[key]
        params.setdefault(key, hf_config.get("max_position_embeddings"))
    return params


def _require(params: dict[str, Any], key: str) -> Any:
    if params.get(key) is None:
        raise ValueError(f"rope type {params['rope_type']!r} needs {key!r} in its parameters.")
    return params[key]


def _base_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (base**exponents)  # [rotary_dim / 2]


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by factor, blend the band between."""
    factor = float(_require(params, "factor"))
    low_freq_factor = float(_require(params, "low_freq_factor"))
    high_freq_factor = float(_require(params, "high_freq_factor"))
    old_context = float(_require(params, "original_max_position_embeddings"))
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(
    params: dict[str, Any], rotary_dim: int, max_position: int
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    base = float(params["rope_theta"])
    original = int(_require(params, "original_max_position_embeddings"))
    factor = params.get("factor") or max_position / original
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        both = m and m_all
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if both else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # avoid dividing by zero in the ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    extrapolation = 1 - ramp  # 1 where the frequency is kept as trained
    interpolated, kept = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
    inv_freq = interpolated * (1 - extrapolation) + kept * extrapolation
    return inv_freq, float(attention_factor)


def compute_inv_freq(
    params: dict[str, Any], rotary_dim: int, max_position: int
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] float32, factor applied to cos and sin)."""
    rope_type = params["rope_type"]
    base = float(params["rope_theta"])
    if rope_type == "yarn":
        return _yarn_inv_freq(params, rotary_dim, max_position)
    inv_freq = _base_inv_freq(base, rotary_dim)
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(_require(params, "factor")), 1.0
    if rope_type == "dynamic":
        # transformers rescales only once a sequence outgrows max_position_embeddings, and
        # max_model_len never exceeds it, so every position we serve uses the base frequencies.
        _require(params, "factor")
        return inv_freq, 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, params), 1.0
    raise ValueError(
        f"Unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}."
    )


def apply_rotary(
    x: torch.Tensor,  # [tokens, heads, head_dim]
    cos: torch.Tensor,  # [tokens, rotary_dim / 2]
    sin: torch.Tensor,  # [tokens, rotary_dim / 2]
) -> torch.Tensor:
    """Rotate the first rotary_dim channels of each head; the rest pass through."""
    half = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [tokens, 1, rotary_dim / 2]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    rotated = (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
    return torch.cat((*rotated, rest), dim=-1)  # [tokens, heads, head_dim]


class RotaryEmbedding(nn.Module):
    """Applies rotary embedding to q and k by position; one instance may serve all layers."""

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        inv_freq: torch.Tensor,  # [rotary_dim / 2] float32
        attention_scaling: float = 1.0,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        positions = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
        freqs = positions[:, None] * inv_freq.float()[None, :]  # [max_position, rotary_dim / 2]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_scaling
        # Non-persistent: derived from the config, never read from or written to a checkpoint.
        self.register_buffer("cos_sin_cache", cache.to(torch.get_default_dtype()), persistent=False)

    def forward(
        self,
        positions: torch.Tensor,  # [tokens] int64
        query: torch.Tensor,  # [tokens, num_heads * head_dim]
        key: torch.Tensor,  # [tokens, num_kv_heads * head_dim]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (query, key). On CUDA the Triton kernel rotates them in place (they may be
        views of the fused qkv output) and returns them; the torch path returns new tensors."""
        if use_triton_for(query):
            return rotary_kernel.rotary_triton(query, key, positions, self.cos_sin_cache, self.head_dim)
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [tokens, rotary_dim / 2] each
        tokens = positions.shape[0]
        q = apply_rotary(query.view(tokens, -1, self.head_dim), cos, sin)
        k = apply_rotary(key.view(tokens, -1, self.head_dim), cos, sin)
        return q.reshape(query.shape), k.reshape(key.shape)

    def rotate_and_store(
        self,
        positions: torch.Tensor,  # [tokens] int64
        query: torch.Tensor,  # [tokens, num_heads * head_dim]
        key: torch.Tensor,  # [tokens, num_kv_heads * head_dim]
        cache: qk_norm_rope_kernel.KVWrite | None,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """forward, and on CUDA with `cache` (Attention.fused_kv_write) the K/V store in the
        same launch (kernels/qk_norm_rope.py without its norms). Returns (q, k, stored)."""
        if cache is not None and use_triton_for(query):
            q, k = qk_norm_rope_kernel.qk_norm_rope_triton(
                query, key, positions, self.cos_sin_cache, self.head_dim, None, None, cache=cache
            )
            return q, k, True
        return (*self(positions, query, key), False)

    def norm_and_rotate(
        self,
        positions: torch.Tensor,  # [tokens] int64
        query: torch.Tensor,  # [tokens, num_heads * head_dim]
        key: torch.Tensor,  # [tokens, num_kv_heads * head_dim]
        q_norm: nn.Module,  # RMSNorm over head_dim (weight, eps)
        k_norm: nn.Module,
        cache: qk_norm_rope_kernel.KVWrite | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Qwen3's order: RMSNorm of every q and k head, then the rotation. On CUDA one kernel
        does both in place (kernels/qk_norm_rope.py), and stores K and V at their slots when
        given `cache` (Attention.fused_kv_write); elsewhere the modules run. Returns (q, k,
        whether K and V were stored)."""
        if use_triton_for(query):
            q, k = qk_norm_rope_kernel.qk_norm_rope_triton(
                query, key, positions, self.cos_sin_cache, self.head_dim,
                q_norm.weight, k_norm.weight, q_norm.eps, k_norm.eps, cache=cache,
            )
            return q, k, cache is not None
        tokens = positions.shape[0]
        q = q_norm(query.reshape(tokens, -1, self.head_dim)).reshape(query.shape)
        k = k_norm(key.reshape(tokens, -1, self.head_dim)).reshape(key.shape)
        return (*self(positions, q, k), False)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
            f"max_position={self.max_position}"
        )


def get_rope(head_dim: int, max_position: int, rope_parameters: dict[str, Any]) -> RotaryEmbedding:
    """A RotaryEmbedding for the flat parameters of rope_parameters_from_hf()."""
    rotary_dim = int(head_dim * float(rope_parameters.get("partial_rotary_factor", 1.0)))
    inv_freq, attention_scaling = compute_inv_freq(rope_parameters, rotary_dim, max_position)
    return RotaryEmbedding(head_dim, rotary_dim, max_position, inv_freq, attention_scaling)
