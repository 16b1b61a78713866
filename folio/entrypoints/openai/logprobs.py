"""Log-probs in the two OpenAI shapes: legacy completions (parallel lists) and chat (content[]).

The engine gives one dict per token, token id -> Logprob: the chosen token with its true rank,
plus the top-k with ranks 1..k (the chosen one appears once). JSON has no -inf, so a log-prob
below LOGPROB_FLOOR (a token masked by top-k, top-p or logit_bias) is sent as the floor.
"""

from __future__ import annotations

import math
from typing import Any

from folio.engine.detokenizer import decode_token, token_bytes
from folio.entrypoints.openai.protocol import ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs
from folio.outputs import Logprob

LOGPROB_FLOOR = -9999.0

TokenEntries = list[dict[int, Logprob] | None]


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) and logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


def _by_rank(entry: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    return sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else math.inf)


def completion_logprobs(
    tokenizer: Any, token_ids: list[int], entries: TokenEntries, text_offset: int
) -> tuple[CompletionLogprobs, int]:
    """The legacy shape for these tokens, offsets counted from `text_offset`; and the next offset.

    top_logprobs holds the top-k and the chosen token (k + 1 entries when it is not in the top-k),
    as OpenAI documents; a prompt's first token (echo) has None for both.
    """
    result = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        text = decode_token(tokenizer, token_id)
        result.tokens.append(text)
        result.text_offset.append(text_offset)
        text_offset += len(text)
        if entry is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        chosen = entry.get(token_id)
        result.token_logprobs.append(finite(chosen.logprob) if chosen is not None else LOGPROB_FLOOR)
        top: dict[str, float] = {}
        for tok, lp in _by_rank(entry):
            # Keys are token texts: two tokens can read the same (partial characters read
            # U+FFFD); the better-ranked one keeps the key.
            top.setdefault(decode_token(tokenizer, tok), finite(lp.logprob))
        result.top_logprobs.append(top)
    return result, text_offset


def chat_logprobs(
    tokenizer: Any, token_ids: list[int], entries: TokenEntries, top_logprobs: int
) -> list[ChatTokenLogprob]:
    """The chat shape: each token with its bytes and its `top_logprobs` most likely alternatives."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        entry = entry or {}
        chosen = entry.get(token_id)
        top = [
            _top(tokenizer, tok, lp)
            for tok, lp in _by_rank(entry)
            if lp.rank is not None and lp.rank <= top_logprobs
        ]
        content.append(
            ChatTokenLogprob(
                token=decode_token(tokenizer, token_id),
                logprob=finite(chosen.logprob) if chosen is not None else LOGPROB_FLOOR,
                bytes=list(token_bytes(tokenizer, token_id)),
                top_logprobs=top[:top_logprobs],
            )
        )
    return content


def _top(tokenizer: Any, token_id: int, logprob: Logprob) -> ChatTopLogprob:
    return ChatTopLogprob(
        token=decode_token(tokenizer, token_id),
        logprob=finite(logprob.logprob),
        bytes=list(token_bytes(tokenizer, token_id)),
    )
