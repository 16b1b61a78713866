"""TokenConstraints: the logit edits a request spells out token by token.

Three of them, applied in this order before penalties: the allowed_token_ids whitelist, the
bans (min_tokens bans stop tokens, EOS and stop_token_ids, while the output is shorter than
min_tokens; bad_words bans the token that would complete a bad word), and logit_bias. The order between the last two does not matter: a banned token is
-inf and stays -inf after any finite bias.

Each is stored sparsely (rows that use it, token ids) so a batch where nobody asks pays nothing,
and the host lists cross to the device once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from folio.sample.transfer import to_device

if TYPE_CHECKING:
    from folio.sample.metadata import SamplingRow


@dataclass
class AllowedTokens:
    rows: torch.Tensor  # [a] int64: batch rows with a whitelist
    banned: torch.Tensor  # [a, vocab] bool: True where the token is NOT on the row's whitelist


@dataclass
class TokenConstraints:
    allowed: AllowedTokens | None
    # min_tokens and bad_words: (rows, token ids) pairs forced to -inf, each [b] int64.
    stop_bans: tuple[torch.Tensor, torch.Tensor] | None
    # logit_bias: (rows [c] int64, token ids [c] int64, values [c] float32), added to the logits.
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
    ) -> TokenConstraints | None:
        """None when no row uses any of the three: the sampler then skips this stage."""
        allowed = _build_allowed(rows, vocab_size, device)
        stop_bans = _build_stop_bans(rows, vocab_size, device)
        bias = _build_bias(rows, device)
        if allowed is None and stop_bans is None and bias is None:
            return None
        return cls(allowed, stop_bans, bias)

    def apply(self, logits: torch.Tensor) -> None:
        """Edit logits [rows, vocab] float32 in place."""
        if self.allowed is not None:
            rows = self.allowed.rows
            logits[rows] = logits[rows].masked_fill(self.allowed.banned, float("-inf"))
        if self.stop_bans is not None:
            logits.index_put_(self.stop_bans, logits.new_full((), float("-inf")))
        if self.bias is not None:
            rows, token_ids, values = self.bias
            # accumulate: a (row, token) pair appears once, but accumulate keeps index_put exact
            # and deterministic whatever the order of pairs.
            logits.index_put_((rows, token_ids), values, accumulate=True)


def _build_allowed(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> AllowedTokens | None:
    batch_rows = [i for i, r in enumerate(rows) if r.params.allowed_token_ids]
    if not batch_rows:
        return None
    local_rows: list[int] = []
    token_ids: list[int] = []
    for local, i in enumerate(batch_rows):
        ids = rows[i].params.allowed_token_ids or []
        local_rows.extend([local] * len(ids))
        token_ids.extend(ids)
    banned = torch.ones(len(batch_rows), vocab_size, dtype=torch.bool, device=device)  # [a, vocab]
    index = (_long(local_rows, device), _long(token_ids, device))
    banned.index_put_(index, banned.new_zeros(()))
    return AllowedTokens(_long(batch_rows, device), banned)


def _build_stop_bans(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    ban_rows: list[int] = []
    token_ids: list[int] = []
    for i, row in enumerate(rows):
        params = row.params
        ids = bad_word_bans(params.bad_words_token_ids, row.output_token_ids) if params.bad_words_token_ids else []
        if row.num_output_tokens < params.min_tokens:
            ids += params.all_stop_token_ids
        # An id outside the logits (a padded tokenizer) can never be sampled: skip it.
        ids = sorted({t for t in ids if t < vocab_size})
        ban_rows.extend([i] * len(ids))
        token_ids.extend(ids)
    if not token_ids:
        return None
    return _long(ban_rows, device), _long(token_ids, device)


def bad_word_bans(bad_words: list[list[int]], output_token_ids: list[int]) -> list[int]:
    """The last token of each bad word whose other tokens end the output (vLLM's rule: a
    one-token word is always banned; only the output is matched, not the prompt)."""
    banned = []
    for word in bad_words:
        prefix = word[:-1]
        if not prefix or (len(output_token_ids) >= len(prefix) and output_token_ids[-len(prefix):] == prefix):
            banned.append(word[-1])
    return banned


def _build_bias(
    rows: Sequence[SamplingRow], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    bias_rows: list[int] = []
    token_ids: list[int] = []
    values: list[float] = []
    for i, row in enumerate(rows):
        bias = row.params.logit_bias
        if not bias:
            continue
        bias_rows.extend([i] * len(bias))
        token_ids.extend(bias.keys())
        values.extend(bias.values())
    if not token_ids:
        return None
    value_tensor = to_device(values, torch.float32, device)
    return _long(bias_rows, device), _long(token_ids, device), value_tensor


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.int64, device)
