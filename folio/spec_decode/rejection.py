"""Rejection sampling of drafts: the accepted tokens follow the target's distribution exactly.

A request with k drafts d_1..d_k has k + 1 rows of target probabilities p_0..p_k (row j scores
the position after d_j; row 0 follows the last known token). Draft j is accepted with
probability min(1, p_{j-1}(d_j) / q_{j-1}(d_j)), drafts are accepted left to right, and at the
first rejection the token is drawn from norm(max(p - q, 0)) instead; when all k are accepted a
bonus token is drawn from p_k. Each emitted token is then distributed as p (Leviathan et al.
2023, Chen et al. 2023). A point-mass draft (n-gram lookup, a draft model's argmax: q = None)
makes the accept rule "with probability p(d)" and the residual "p without d".

Greedy rows accept a draft when it is the target's argmax, and their extra token is the argmax:
the longest matching prefix plus the target's own next token.

All of it is one batched computation over the flat rows; the randomness comes in as
`uniforms` (one per row) and `noise` (Exponential(1), one per row and token), drawn by the
caller so a seeded request draws only from its own generator (spec_decode/verifier.py).
"""

from __future__ import annotations

import torch


def rejection_sample(
    target_probs: torch.Tensor | None,  # [rows, vocab] float32; None: every request is greedy
    target_argmax: torch.Tensor,  # [rows] int64, the target's greedy token per row
    draft_ids: torch.Tensor,  # [rows] int64: row j of a request holds d_{j+1}; its last row any
    num_drafts: torch.Tensor,  # [requests] int64, k_i (request i has k_i + 1 rows)
    greedy: torch.Tensor,  # [requests] bool
    uniforms: torch.Tensor | None = None,  # [rows] float32 in [0, 1)
    noise: torch.Tensor | None = None,  # [rows, vocab] float32, Exponential(1)
    draft_probs: torch.Tensor | None = None,  # [rows, vocab]; None: point-mass drafts
    max_k: int | None = None,  # max(num_drafts) when the caller knows it (saves a device sync)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (tokens [requests, max_k + 1] int64, -1 past each request's end; num_accepted
    [requests] int64). Request i emits tokens[i, : num_accepted[i] + 1]."""
    num_rows = target_argmax.shape[0]
    starts = torch.cumsum(num_drafts + 1, 0) - (num_drafts + 1)  # [requests] first row of each
    bonus_rows = starts + num_drafts  # [requests] each request's last row
    accept = target_argmax == draft_ids  # [rows] greedy rule
    recovered, bonus = target_argmax, target_argmax[bonus_rows]  # [rows], [requests]
    if target_probs is not None:
        assert uniforms is not None and noise is not None
        row_greedy = torch.repeat_interleave(greedy, num_drafts + 1, output_size=num_rows)  # [rows]
        r_accept, r_recovered = _accept_and_recover(target_probs, draft_ids, uniforms, noise, draft_probs)
        accept = torch.where(row_greedy, accept, r_accept)
        recovered = torch.where(row_greedy, recovered, r_recovered)
        r_bonus = _race(target_probs[bonus_rows], noise[bonus_rows])  # [requests] drawn from p
        bonus = torch.where(greedy, bonus, r_bonus)
    if max_k is None:
        max_k = int(num_drafts.max()) if num_drafts.numel() else 0
    cols = torch.arange(max_k + 1, device=draft_ids.device)  # [max_k + 1]
    rows = (starts.unsqueeze(1) + cols).clamp(max=num_rows - 1)  # [requests, max_k + 1]
    is_draft = cols[:max_k].unsqueeze(0) < num_drafts.unsqueeze(1)  # [requests, max_k]
    accepted = accept[rows[:, :max_k]] & is_draft  # [requests, max_k]
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [requests] leading accepts
    # The request's own token: the residual draw at its first rejection, or the bonus.
    own = torch.where(num_accepted == num_drafts, bonus, recovered[starts + num_accepted])  # [requests]
    tokens = draft_ids[rows].clone()  # [requests, max_k + 1]
    tokens.scatter_(1, num_accepted.unsqueeze(1), own.unsqueeze(1))
    tokens.masked_fill_(cols.unsqueeze(0) > num_accepted.unsqueeze(1), -1)
    return tokens, num_accepted


def _accept_and_recover(
    p: torch.Tensor,  # [rows, vocab]
    draft_ids: torch.Tensor,  # [rows]
    uniforms: torch.Tensor,  # [rows]
    noise: torch.Tensor,  # [rows, vocab]
    q: torch.Tensor | None,  # [rows, vocab] or None (point mass)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: whether its draft is accepted, and a token drawn from the residual
    norm(max(p - q, 0)). A request's last row has no draft: both are computed and never read."""
    index = draft_ids.unsqueeze(1)  # [rows, 1]
    p_draft = p.gather(1, index).squeeze(1)  # [rows]
    if q is None:
        accept = uniforms < p_draft  # [rows] q(d) = 1: accept with probability p(d)
        residual = p.scatter(1, index, 0.0)  # [rows, vocab] p without d
    else:
        q_draft = q.gather(1, index).squeeze(1)  # [rows]
        accept = uniforms * q_draft < p_draft  # [rows] with probability min(1, p/q)
        residual = (p - q).clamp_min_(0.0)  # [rows, vocab]
    # A residual that is all zero (p == q) is never used: such a draft is always accepted.
    recovered = _race(residual, noise)  # [rows]
    return accept, recovered


def _race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(weights / noise): token i with probability weights_i / sum(weights)."""
    return (weights / noise.clamp_min(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
