"""Truncation of the distribution after temperature: min_p, then top-k, then top-p.

Each masks the logits of the tokens it drops to -inf, in place. Rows that do not use a given
truncation carry its neutral value (min_p 0, top_k = vocab, top_p 1) and come out unchanged, so
one batched call serves a mixed batch.

Invariant that keeps seeded sampling independent of the batch: a row's result depends only on
that row. The top-k threshold is a value (the k-th largest logit; ties with it are kept), found
either by `topk` or by a full sort, and both give the same value, so whether the batch needed a
sort (some row uses top-p) cannot change which tokens a top-k row keeps.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens whose probability is below min_p times the most likely token's.

    logits [rows, vocab] float32 (after temperature), min_p [rows] float32 in [0, 1].
    """
    probs = logits.softmax(dim=-1)  # [rows, vocab]
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)  # [rows, 1]
    logits.masked_fill_(probs < threshold, _NEG_INF)


def apply_top_k_top_p(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    max_top_k: int,
) -> None:
    """Keep each row's top_k most likely tokens, then the smallest top set whose mass reaches top_p.

    logits [rows, vocab] float32; top_k [rows] int64 in [1, vocab] (vocab = off); top_p [rows]
    float32 in (0, 1] (1 = off); max_top_k: the largest top_k below vocab in the batch. Top-p
    is measured on the distribution left after top-k, renormalised, as in vLLM.
    """
    if top_p is None:
        if top_k is not None:
            _apply_top_k_only(logits, top_k, max_top_k)
        return
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1)  # [rows, vocab] ascending, and their token ids
    if top_k is not None:
        kth_largest = sorted_logits.gather(1, (vocab - top_k).unsqueeze(1))  # [rows, 1]
        sorted_logits.masked_fill_(sorted_logits < kth_largest, _NEG_INF)
    # Ascending cumulative mass: a token is dropped when the tokens at or below it hold at most
    # 1 - top_p, i.e. the strictly more likely tokens already reach top_p. The top token is
    # never dropped, and rows with top_p == 1 drop nothing (not even zero-probability ties).
    below = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [rows, vocab]
    drop = below <= (1.0 - top_p).unsqueeze(1)  # [rows, vocab]
    drop &= (top_p < 1.0).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, _NEG_INF)
    logits.scatter_(1, order, sorted_logits)


def _apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> None:
    """Top-k without sorting the vocabulary: `topk(max_top_k)` finds every row's threshold."""
    vocab = logits.shape[-1]
    largest = logits.topk(max_top_k, dim=-1).values  # [rows, max_top_k] descending
    k_index = (top_k.clamp(max=max_top_k) - 1).unsqueeze(1)  # [rows, 1]
    kth_largest = largest.gather(1, k_index)  # [rows, 1]
    kth_largest.masked_fill_((top_k >= vocab).unsqueeze(1), _NEG_INF)  # rows without top-k
    logits.masked_fill_(logits < kth_largest, _NEG_INF)
