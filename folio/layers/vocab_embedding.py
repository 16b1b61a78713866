"""Token embedding and the LM head (optionally sharing the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    """[tokens] int64 -> [tokens, embedding_dim]."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [tokens, embedding_dim]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LMHead(nn.Module):
    """[n, embedding_dim] -> [n, vocab] float32 logits.

    The matmul runs in the model dtype (as transformers does) and only the result is widened,
    so sampling and log-probs see float32 whatever the weights are.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.bias = nn.Parameter(torch.empty(num_embeddings)) if bias else None

    def tie_to(self, embedding: VocabEmbedding) -> None:
        """Share the embedding's parameter: one tensor, listed once by named_parameters()."""
        if embedding.weight.shape != self.weight.shape:
            raise ValueError(
                f"Cannot tie an LM head of shape {tuple(self.weight.shape)} to an embedding of "
                f"shape {tuple(embedding.weight.shape)}."
            )
        self.weight = embedding.weight

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight, self.bias).float()  # [n, vocab]

    def extra_repr(self) -> str:
        return f"{self.embedding_dim} -> {self.num_embeddings}"
