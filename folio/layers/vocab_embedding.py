"""Token embedding and the LM head, vocab-parallel: each rank holds a contiguous slice of rows.

With tp ranks the vocabulary is padded to a multiple of tp and rank r holds rows
[r * V/tp, (r + 1) * V/tp); padding rows are zero and never loaded. The embedding looks up the
ids in its slice (others read row 0, then are zeroed) and all-reduces, so each token's vector
comes from the one rank that holds it. The LM head computes its slice of the logits and
all-gathers them, dropping the padding columns. At tp = 1 both are the plain layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.kernels.gemv import linear
from folio.layers.checkpoint_slice import as_tensor
from folio.layers.linear import check_shape
from folio.parallel import all_gather, all_reduce, get_tp_rank, get_tp_size


class VocabParallelRows(nn.Module):
    """A [vocab, dim] table split by rows over the ranks (parallel=False: whole on every rank)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, parallel: bool = True) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size = (get_tp_rank(), get_tp_size()) if parallel else (0, 1)
        self.rows_per_rank = -(-num_embeddings // self.tp_size)  # padded vocab / tp
        self.row_start = self.tp_rank * self.rows_per_rank
        # Rows of this rank's slice that exist in the checkpoint (the rest is padding).
        self.num_loaded_rows = max(0, min(self.rows_per_rank, num_embeddings - self.row_start))
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        """Copy this rank's rows of a [vocab, ...] checkpoint tensor; zero the padding rows."""
        expected = (self.num_embeddings, *param.shape[1:])
        check_shape(f"a {type(self).__name__} table", torch.Size(expected), loaded)
        rows = self.num_loaded_rows
        param.data[:rows].copy_(as_tensor(loaded.narrow(0, self.row_start, rows)))
        param.data[rows:].zero_()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows {self.row_start}+{self.rows_per_rank}"


class VocabEmbedding(VocabParallelRows):
    """[tokens] int64 -> [tokens, embedding_dim]."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [tokens, embedding_dim]
        local = input_ids - self.row_start  # [tokens]
        foreign = (local < 0) | (local >= self.num_loaded_rows)  # [tokens] held by another rank
        out = F.embedding(local.masked_fill(foreign, 0), self.weight)  # [tokens, embedding_dim]
        return all_reduce(out.masked_fill_(foreign.unsqueeze(-1), 0))


class LMHead(VocabParallelRows):
    """[n, embedding_dim] -> [n, vocab] float32 logits, on every rank.

    The matmul runs in the model dtype (as transformers does) and only the result is widened,
    so sampling and log-probs see float32 whatever the weights are. widen=False keeps the model
    dtype, for the sampler: its argmax and Gumbel draw read 16-bit logits exactly and it widens
    what it edits itself, so the float32 copy of every step's [rows, vocab] is not made.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.bias = nn.Parameter(torch.empty(self.rows_per_rank), requires_grad=False) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def tie_to(self, embedding: VocabEmbedding) -> None:
        """Share the embedding's parameter: one tensor, listed once by named_parameters()."""
        if embedding.weight.shape != self.weight.shape or embedding.row_start != self.row_start:
            raise ValueError(
                f"Cannot tie an LM head of shape {tuple(self.weight.shape)} to an embedding of "
                f"shape {tuple(embedding.weight.shape)}."
            )
        self.weight = embedding.weight

    def forward(self, hidden_states: torch.Tensor, widen: bool = True) -> torch.Tensor:
        # [n, vocab / tp (padded)]; one row on CUDA takes the Triton GEMV, as the linear layers do
        # (session 13, H100, the 8B: 5.82 vs 5.89 ms per bf16 token, 2.87 vs 2.92 INT4).
        logits = linear(hidden_states, self.weight, self.bias)
        if self.tp_size > 1:
            logits = all_gather(logits, dim=-1)[:, : self.num_embeddings]  # [n, vocab]
        return logits.float() if widen else logits
