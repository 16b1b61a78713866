"""The interface every attention backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from folio.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str = "base"

    @abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """Store each token's K and V at its slot in the paged cache (an FP8 cache stores
        K / k_scale and V / v_scale)."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        key: torch.Tensor | None = None,  # [num_tokens, num_kv_heads, head_dim]: this step's K, as stored
        value: torch.Tensor | None = None,  # [num_tokens, num_kv_heads, head_dim]: this step's V
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Causal attention of each new token over its sequence's cached context (itself included).

        The step's K/V are in the cache already; key and value, when given (a full-precision
        cache), hold the same new K/V, which a backend may read instead of the cache.
        Rows past metadata.num_actual_tokens are padding and may hold anything.
        """
