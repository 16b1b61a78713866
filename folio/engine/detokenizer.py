"""Incremental detokenization: the text each new batch of tokens adds, at a cost bounded by a window.

Decoding the whole output again at every step would cost O(output length) per token. Instead the
detokenizer keeps a short window of token ids: `_window[:_read]` is the *prefix*, tokens whose text
was already emitted and that serve only as context, and `_window[_read:]` are tokens whose text
is still to come. Each step decodes prefix + pending tokens, and the new text is what lies past
the prefix's own decoding. Context matters because decoders are not concatenative at the start
of a sequence (sentencepiece-style decoders strip one leading space) and because one character
can span several byte-level tokens.

Invariants:
- The window starts at a character boundary of the byte stream: it only moves to a point where
  the decoded text ended in a complete character (not U+FFFD).
- Text ending in U+FFFD is held back, since the next token may complete the character; it is
  released when the character completes, when more text follows it, or at `finished=True`.
- Text whose last kept token is a byte-fallback token (<0xNN>) is held back too: such a decoder
  turns a run of byte tokens into text as a group, and a run that turns out invalid UTF-8 reads
  as U+FFFD for *every* byte, even an ASCII one already complete ("=" + <0xC0> -> "��"). The run
  is final once a token that is not a byte token follows it.
- Unless the window starts at the very first token, its prefix holds at least one token that the
  decode keeps (not a skipped special token), so both decodes strip the same leading space.

With these, the concatenated deltas equal `decode(prompt + output)` minus `decode(prompt)`; for a
byte-level BPE that is exactly `decode(output)`. A sentencepiece-style decoder differs in one
place: decoded alone, an output's first token loses its leading "▁" space, while here (in the
prompt's context) it keeps it, as the text reads after the prompt. Two edge cases, both tested:
a prompt that ends inside a UTF-8 character gets an output decoded on its own (its first bytes
read U+FFFD); and with byte fallback, when the prompt ends in byte tokens and the output's first
byte tokens make that run invalid UTF-8, the prompt's part of the run would read differently in
context, which emitted text cannot follow: the output is then the context decode past the
prompt text's length. Emitted text is never taken back.

Cost: two decodes of the window per step that emits text; the second is usually of one token,
whose text is cached per tokenizer. The window holds the tokens emitted
last step plus those not yet emitted; only output that keeps ending in U+FFFD (garbage bytes)
lets it grow, until something decodable follows.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable
from typing import Any

REPLACEMENT_CHAR = "\ufffd"
# Kept tokens of prompt context the first window starts with. One would do for the strip rule;
# a few more cover decoders that look at neighbouring tokens (e.g. WordPiece's "##").
_PROMPT_CONTEXT_TOKENS = 5
# Bound on how far back into the prompt the first window may reach past skipped special tokens.
_PROMPT_CONTEXT_MAX = 64


class IncrementalDetokenizer:
    """Turns one sequence's new token ids into new text, step by step."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._decode_ids = _decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self._special_ids = special_token_ids(tokenizer) if skip_special_tokens else frozenset()
        self._byte_ids = byte_fallback_ids(tokenizer)
        self._window = self._prompt_context(prompt_token_ids)
        self._prefix_text = self._decode(self._window)
        if self._prefix_text.endswith(REPLACEMENT_CHAR):
            # The prompt ends inside a character: its remaining bytes are output, decoded alone.
            self._window, self._prefix_text = [], ""
        self._read = len(self._window)
        self.output_text = ""  # everything emitted so far

    def append(self, new_token_ids: list[int], *, finished: bool = False) -> str:
        """Add tokens; return the text they complete. With finished=True, release held-back text."""
        self._window.extend(new_token_ids)
        text = self._decode(self._window)
        grew = len(text) > len(self._prefix_text)
        if not finished and (not grew or text.endswith(REPLACEMENT_CHAR) or self._in_byte_run()):
            return ""  # nothing new yet, or a character or byte run still open: wait for more
        delta = text[len(self._prefix_text) :] if grew else ""
        # Slide: the tokens just emitted become the next prefix (they hold a kept token, since
        # their text grew). Everything before them is dropped, which keeps each step O(window).
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self._prefix_text = self._decode(self._window)
        self.output_text += delta
        return delta

    def _in_byte_run(self) -> bool:
        """Whether the last kept token is a byte-fallback token (its run may still grow)."""
        if not self._byte_ids:
            return False
        for token_id in reversed(self._window):
            if token_id not in self._special_ids:
                return token_id in self._byte_ids
        return False

    def _prompt_context(self, prompt_token_ids: list[int]) -> list[int]:
        """The prompt's last few kept tokens (and any skipped specials among or after them)."""
        start, kept = len(prompt_token_ids), 0
        lowest = max(0, len(prompt_token_ids) - _PROMPT_CONTEXT_MAX)
        while start > lowest and kept < _PROMPT_CONTEXT_TOKENS:
            start -= 1
            kept += prompt_token_ids[start] not in self._special_ids
        # Never start inside a byte-fallback run: cut, the run would decode as U+FFFD throughout.
        in_run = self._byte_ids | self._special_ids
        ids = prompt_token_ids
        while start > lowest and ids[start] in in_run and ids[start - 1] in in_run:
            start -= 1
        return list(prompt_token_ids[start:])

    def _decode(self, token_ids: list[int]) -> str:
        return self._decode_ids(token_ids) if token_ids else ""


def _decoder(
    tokenizer: Any, skip_special_tokens: bool, spaces_between_special_tokens: bool
) -> Callable[[list[int]], str]:
    """`plain_decoder`, with the text of one-token lists cached per tokenizer and options: in
    steady state every step's second decode (the new prefix after the slide) is one token, so
    it becomes a dict lookup (decoding is a pure function of the ids)."""
    decode = plain_decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
    per_tokenizer = _WINDOW_TEXT.get(tokenizer)
    if per_tokenizer is None:
        per_tokenizer = _WINDOW_TEXT.setdefault(tokenizer, {})
    cache = per_tokenizer.setdefault((skip_special_tokens, spaces_between_special_tokens), {})

    def decode_ids(token_ids: list[int]) -> str:
        if len(token_ids) != 1:
            return decode(token_ids)
        text = cache.get(token_ids[0])
        if text is None:
            text = cache[token_ids[0]] = decode(token_ids)
        return text

    return decode_ids


def plain_decoder(
    tokenizer: Any, skip_special_tokens: bool, spaces_between_special_tokens: bool
) -> Callable[[list[int]], str]:
    """`ids -> text` as `tokenizer.decode(ids, skip_special_tokens, no cleanup)` computes it.

    No clean-up of tokenization spaces: applied to a window, it could remove a space that
    belongs to text already emitted. For a fast tokenizer that makes transformers' decode a
    plain call into the Rust tokenizer, so the detokenizer calls that directly: this runs for
    every generated token, and the Python wrapper would cost more than the decode itself.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if getattr(tokenizer, "is_fast", False) and callable(getattr(backend, "decode", None)):
        return functools.partial(backend.decode, skip_special_tokens=skip_special_tokens)
    kwargs: dict[str, Any] = {
        "skip_special_tokens": skip_special_tokens,
        "clean_up_tokenization_spaces": False,
    }
    if not getattr(tokenizer, "is_fast", True):
        # Only the Python ("slow") tokenizers implement it; fast ones join tokens as they are.
        kwargs["spaces_between_special_tokens"] = spaces_between_special_tokens
    return functools.partial(tokenizer.decode, **kwargs)


# ---- single tokens (log-prob entries) --------------------------------------------------------

# Per tokenizer and (skip_special_tokens, spaces_between_special_tokens): the detokenizer's
# decode of a one-token list. Weak keys so a dropped tokenizer takes its cache with it.
_WINDOW_TEXT: weakref.WeakKeyDictionary[Any, dict[tuple[bool, bool], dict[int, str]]] = weakref.WeakKeyDictionary()
# Per tokenizer: token id -> text. Weak keys so a dropped tokenizer takes its cache with it.
_TOKEN_TEXT: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()
_SPECIAL_IDS: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()
_BYTE_IDS: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()
_ANCHOR: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids `decode(..., skip_special_tokens=True)` drops (cached: the property is slow)."""
    ids = _SPECIAL_IDS.get(tokenizer)
    if ids is None:
        ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        _SPECIAL_IDS[tokenizer] = ids
    return ids


def byte_fallback_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the <0x00>..<0xFF> tokens of a byte-fallback (sentencepiece-style) tokenizer."""
    ids = _BYTE_IDS.get(tokenizer)
    if ids is None:
        ids = frozenset()
        model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
        if getattr(model, "byte_fallback", False):
            ids = frozenset(i for tok, i in tokenizer.get_vocab().items() if _BYTE_TOKEN.fullmatch(tok))
        _BYTE_IDS[tokenizer] = ids
    return ids


def decode_token(tokenizer: Any, token_id: int) -> str:
    """The text of one token as it reads inside a text (leading space kept), special tokens shown.

    A token is decoded after an anchor token and the anchor's text removed, because
    sentencepiece-style decoders strip the leading space of a token decoded alone ("▁the" would
    read "the"). A token that is part of a multi-byte character reads as U+FFFD.
    """
    cache = _TOKEN_TEXT.get(tokenizer)
    if cache is None:
        cache = _TOKEN_TEXT.setdefault(tokenizer, {})
    text = cache.get(token_id)
    if text is None:
        text = _decode_in_context(tokenizer, token_id)
        cache[token_id] = text
    return text


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The raw UTF-8 bytes of one token, also for tokens that hold only part of a character."""
    text = decode_token(tokenizer, token_id)
    if REPLACEMENT_CHAR not in text:
        return text.encode("utf-8")
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str):
        match = _BYTE_TOKEN.fullmatch(piece)
        if match:  # sentencepiece byte fallback
            return bytes([int(match.group(1), 16)])
        if all(ch in _BYTE_LEVEL_DECODER for ch in piece):  # GPT-2 byte-level alphabet
            return bytes(_BYTE_LEVEL_DECODER[ch] for ch in piece)
    return text.encode("utf-8")


def _decode_in_context(tokenizer: Any, token_id: int) -> str:
    alone = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    anchor = _anchor(tokenizer)
    if anchor is None:
        return alone
    kwargs = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    anchor_text = tokenizer.decode([anchor], **kwargs)
    both = tokenizer.decode([anchor, token_id], **kwargs)
    if not both.startswith(anchor_text):
        return alone
    return both[len(anchor_text) :]


def _anchor(tokenizer: Any) -> int | None:
    """A plain, complete token to decode others after (the token for "a"), or None."""
    if tokenizer in _ANCHOR:
        return _ANCHOR[tokenizer]
    ids = tokenizer.encode("a", add_special_tokens=False)
    anchor = ids[0] if len(ids) == 1 else None
    _ANCHOR[tokenizer] = anchor
    return anchor


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's map from the printable stand-in characters back to the bytes they encode."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


_BYTE_LEVEL_DECODER = _byte_level_decoder()
