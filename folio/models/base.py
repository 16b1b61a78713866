"""The interface every model implements, so the runner treats all architectures alike."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import nn

from folio.attention.metadata import AttentionMetadata


class CausalLM(nn.Module, ABC):
    """A decoder-only language model over a flat batch of tokens and a paged KV cache.

    Each attention layer owns one view of the KV cache, bound once by `bind_kv_caches` after the
    runner allocates it; the per-step AttentionMetadata is passed explicitly to forward().
    """

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64, position of each token in its sequence
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden_size], the final-norm hidden states
        ...

    @abstractmethod
    def compute_logits(self, hidden_states: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """[n, hidden_size] -> [n, vocab_size] float32 logits (widen=False: in the model dtype)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (HF names) into the parameters; return the names loaded."""

    def attention_layers(self) -> list[nn.Module]:
        """The Attention modules in layer order; one KV cache view each."""
        from folio.layers.attention import Attention

        return [m for m in self.modules() if isinstance(m, Attention)]

    def bind_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        layers = self.attention_layers()
        if len(layers) != len(kv_caches):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} attention layers.")
        for layer, cache in zip(layers, kv_caches):
            layer.kv_cache = cache
