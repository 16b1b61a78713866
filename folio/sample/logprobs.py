"""Log-probs of chosen tokens and the top-k alternatives, for sampled and prompt tokens alike.

Log-probs are those of the model's raw distribution (log_softmax of the logits before any
penalty, bias, temperature or truncation), as vLLM's default `raw_logprobs` mode returns.
"""

from __future__ import annotations

import torch


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] float32 log-probs of logits [rows, vocab] (any float dtype)."""
    return logits.to(torch.float32).log_softmax(dim=-1)


def gather_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of token_ids [rows] under logits [rows, vocab], with each row's top-k.

    Returns (ids [rows, k + 1] int64, logprobs [rows, k + 1] float32, ranks [rows] int64), the
    chosen token first, then the k most likely tokens best first (k = min(num_logprobs, vocab);
    the chosen token may appear again among them).
    """
    return gather_from_logprobs(compute_logprobs(logits), token_ids, num_logprobs)


def gather_from_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As gather_logprobs, from log-probs [rows, vocab] already computed."""
    token_ids = token_ids.to(torch.int64).unsqueeze(1)  # [rows, 1]
    chosen = logprobs.gather(1, token_ids)  # [rows, 1]
    # Rank 1 = most likely. Counting only strictly better tokens gives tied tokens the best
    # rank they share, so a greedy token always has rank 1.
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # [rows]
    k = min(num_logprobs, logprobs.shape[-1])
    if k == 0:
        return token_ids, chosen, ranks
    top_values, top_ids = logprobs.topk(k, dim=-1)  # [rows, k] each
    ids = torch.cat([token_ids, top_ids], dim=1)  # [rows, k + 1]
    values = torch.cat([chosen, top_values], dim=1)  # [rows, k + 1]
    return ids, values, ranks
