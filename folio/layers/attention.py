"""Attention layer: stores this step's K/V in the paged cache, then attends through it.

The layer holds no state about a batch: the AttentionMetadata of the step is passed in.
With an FP8 KV cache it stores K / k_scale and V / v_scale: per-tensor scales loaded from the
checkpoint (`self_attn.k_scale` / `v_scale` as llm-compressor writes them, or the older
`self_attn.k_proj.output_scale` / `v_proj.output_scale` and the other names vLLM maps:
weight_utils.kv_scale_targets) or 1.0.
"""

from __future__ import annotations

import torch
from torch import nn

from folio.attention.backends.base import AttentionBackend
from folio.attention.backends.torch_ref import prefill_attention_no_cache
from folio.attention.metadata import AttentionMetadata
from folio.kernels.qk_norm_rope import KVWrite
from folio.kernels.reshape_and_cache import FP8_KV_DTYPE


class Attention(nn.Module):
    """Causal multi-head attention with grouped K/V heads over a paged KV cache.

    kv_cache is this layer's view [2, num_blocks, block_size, num_kv_heads, head_dim], bound by
    CausalLM.bind_kv_caches; while it is None (the memory-profiling pass, a batch of whole
    prompts) attention runs within each prompt and nothing is stored.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        backend: AttentionBackend,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})."
            )
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.backend = backend
        self.sliding_window = sliding_window
        self.kv_cache: torch.Tensor | None = None
        # Checkpoint scales (optional; 1.0 without), in the model dtype like every parameter:
        # writes and reads use the same rounded value. keep_init: dummy weights leave them at 1.
        self.k_scale = nn.Parameter(torch.ones(()), requires_grad=False)
        self.v_scale = nn.Parameter(torch.ones(()), requires_grad=False)
        for param in (self.k_scale, self.v_scale):
            param.optional = True  # type: ignore[attr-defined]
            param.keep_init = True  # type: ignore[attr-defined]
        self.k_scale_value = self.v_scale_value = 1.0  # host copies the kernels take

    def process_weights_after_loading(self) -> None:
        """Copy the loaded scales to host floats once, so no step synchronises to read them."""
        self.k_scale_value = float(self.k_scale)
        self.v_scale_value = float(self.v_scale)
        if self.k_scale_value <= 0 or self.v_scale_value <= 0:
            raise ValueError(f"KV cache scales must be positive, got k {self.k_scale_value}, v {self.v_scale_value}.")

    def fused_kv_write(self, value: torch.Tensor, attn_metadata: AttentionMetadata) -> KVWrite | None:
        """Where a kernel that produces this step's K (kernels/qk_norm_rope.py) may store K and V
        itself, sparing the separate reshape_and_cache launch: only with the Triton backend
        and a cache bound, one slot per token; None otherwise (then forward stores them)."""
        if self.kv_cache is None or self.backend.name != "triton" or attn_metadata.slot_mapping.shape[0] != value.shape[0]:
            return None
        return KVWrite(value, self.kv_cache, attn_metadata.slot_mapping, self.k_scale_value, self.v_scale_value)

    def forward(
        self,
        query: torch.Tensor,  # [tokens, num_heads * head_dim]
        key: torch.Tensor,  # [tokens, num_kv_heads * head_dim]
        value: torch.Tensor,  # [tokens, num_kv_heads * head_dim]
        attn_metadata: AttentionMetadata,
        kv_written: bool = False,  # K and V are in the cache already (fused_kv_write was used)
    ) -> torch.Tensor:  # [tokens, num_heads * head_dim]
        tokens = query.shape[0]
        q = query.view(tokens, self.num_heads, self.head_dim)
        k = key.view(tokens, self.num_kv_heads, self.head_dim)
        v = value.view(tokens, self.num_kv_heads, self.head_dim)
        if self.kv_cache is None:
            out = prefill_attention_no_cache(
                q, k, v, attn_metadata.query_start_loc_cpu, self.scale, self.sliding_window
            )
        else:
            # Checkpoint scales describe an FP8 cache; a full-precision one holds K and V as they are.
            fp8 = self.kv_cache.dtype == FP8_KV_DTYPE
            scales = dict(k_scale=self.k_scale_value, v_scale=self.v_scale_value) if fp8 else {}
            if not kv_written:
                self.backend.write_kv(k, v, self.kv_cache, attn_metadata.slot_mapping, **scales)
            # The fresh K/V go along where the cache holds them as they are (not FP8).
            fresh = {} if fp8 else dict(key=k, value=v)
            out = self.backend.forward(
                q, self.kv_cache, attn_metadata, self.scale, self.sliding_window, **scales, **fresh
            )
        return out.reshape(tokens, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"scale={self.scale:.4g}, sliding_window={self.sliding_window}, "
            f"backend={self.backend.name}"
        )
