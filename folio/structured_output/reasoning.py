"""Structured outputs after reasoning: a grammar that starts once the model has closed its thought.

vLLM's rule for a reasoning model (structured_outputs_config.reasoning_parser, set by the server's
--reasoning-parser): the grammar does not constrain the reasoning; it applies from the token after
the reasoning's end marker (`</think>`), so the model thinks first, then answers in the asked
language. `enable_in_reasoning` keeps the grammar on from the first token instead.

AfterReasoning wraps a sample's GrammarState: every token is allowed until the end marker is
accepted, then the inner grammar takes over from its start. The marker must be one token in the
tokenizer (Qwen3's and DeepSeek-R1's `</think>` are); a tokenizer without it gets the grammar from
the first token, with a warning (reasoning_end_token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from folio.logger import init_logger

if TYPE_CHECKING:
    import torch

    from folio.structured_output.backend import GrammarState

logger = init_logger(__name__)

# The parsers the server knows (entrypoints/openai/reasoning_parsers) and their markers.
REASONING_MARKERS = {"qwen3": ("<think>", "</think>"), "deepseek_r1": ("<think>", "</think>")}


def reasoning_end_token(parser: str, tokenizer: Any, warn: bool = True) -> tuple[int, int | None] | None:
    """(end marker id, start marker id or None) when the tokenizer has the end marker as one
    token; None (with a warning) when it does not, so grammars apply from the first token."""
    start, end = REASONING_MARKERS[parser]
    end_id, start_id = _single_token(tokenizer, end), _single_token(tokenizer, start)
    if end_id is None and warn:
        logger.warning("Reasoning parser %s: %r is not one token of this tokenizer, so structured outputs "
                       "constrain the output from its first token (the model cannot reason first).", parser, end)
    return None if end_id is None else (end_id, start_id)


def _single_token(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False) if tokenizer is not None else []
    return ids[0] if len(ids) == 1 else None


def reasoning_ended(prompt_token_ids: Sequence[int], end_id: int, start_id: int | None) -> bool:
    """Whether the prompt itself closes the reasoning (Qwen3's enable_thinking=False template
    writes `<think>\\n\\n</think>`): its last end marker comes after its last start marker."""
    last_end = _last_index(prompt_token_ids, end_id)
    if last_end < 0:
        return False
    return start_id is None or _last_index(prompt_token_ids, start_id) < last_end


def _last_index(ids: Sequence[int], token: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1


class AfterReasoning:
    """A GrammarState that allows every token until `end_id` is accepted, then is `inner`."""

    def __init__(self, inner: GrammarState, end_id: int) -> None:
        self.inner = inner
        self.end_id = end_id
        self.reasoning = 0  # tokens accepted before the grammar began, the marker included
        self.inside = 0  # tokens the grammar accepted
        self.started = False

    def accept_token(self, token_id: int) -> bool:
        if self.started:
            accepted = self.inner.accept_token(token_id)
            self.inside += accepted
            return accepted
        self.reasoning += 1
        self.started = token_id == self.end_id
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.started:
            self.inner.fill_bitmask(bitmask, row)
        else:
            bitmask[row] = -1  # every token

    def rollback(self, num_tokens: int) -> None:
        """Undo the grammar's tokens first, then the reasoning's (undoing the marker reopens it)."""
        inner = min(num_tokens, self.inside)
        if inner:
            self.inner.rollback(inner)
            self.inside -= inner
        rest = num_tokens - inner
        if rest:
            self.reasoning -= rest
            self.started = False

    def reset(self) -> None:
        self.inner.reset()
        self.reasoning = self.inside = 0
        self.started = False

    def is_terminated(self) -> bool:
        return self.started and self.inner.is_terminated()
