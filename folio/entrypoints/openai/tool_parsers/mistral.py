"""Mistral tool calls: content, then `[TOOL_CALLS]` and a JSON list of {"name", "arguments"}
(or, from the v11 tokenizers on, `[TOOL_CALLS]name{...}` / `[TOOL_CALLS]name[ARGS]{...}`), repeated.

`[TOOL_CALLS]` and `[ARGS]` are special tokens: the server keeps special tokens in the text for
this parser (serving_chat.py), as vLLM does. Text after the calls is content at the end of the
output; a call that does not parse ends the calls, and from its marker on the text is content.
"""

from __future__ import annotations

import re
import secrets
import string

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, call_from_object, decode_at, held_back

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
SPACE = " \t\r\n"
ID_ALPHABET = string.ascii_letters + string.digits
NAME = re.compile(r"[A-Za-z0-9_.:-]+")


class MistralToolParser(ToolParser):
    keeps_special_tokens = True

    def call_id(self) -> str:
        """9 letters and digits: Mistral's chat templates refuse any other tool call id when the
        call comes back in the conversation (vLLM's MistralToolCall ids)."""
        return "".join(secrets.choice(ID_ALPHABET) for _ in range(9))

    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        start = text.find(MARKER)
        if start < 0:
            return text if final else text[: held_back(text, MARKER)], []
        calls: list[ParsedCall] = []
        pos = start
        while (read := _calls(text, pos + len(MARKER))) is not None:
            calls += read[0]
            pos = read[1]
            following = len(text) - len(text[pos:].lstrip(SPACE))
            if not text.startswith(MARKER, following):
                break
            pos = following
        if not final:
            return text[:start], calls
        if not calls:
            return text, []
        rest = text[pos:]
        return text[:start] + (rest if rest.strip(SPACE) else ""), calls


def _calls(text: str, pos: int) -> tuple[list[ParsedCall], int] | None:
    """The calls after one marker and where they end; None while incomplete or not calls."""
    body = text[pos:].lstrip(SPACE)
    if body[:1] in ("[", "{"):
        decoded = decode_at(text, pos)
        if decoded is None:
            return None
        items = decoded[0] if isinstance(decoded[0], list) else [decoded[0]]
        calls = [call_from_object(item) for item in items]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None], decoded[1]
    brace = text.find("{", pos)  # name{...}, or name[ARGS]{...} where [ARGS] is kept
    name = text[pos:brace].strip(SPACE) if brace >= 0 else ""
    name = name.removesuffix(ARGS).rstrip(SPACE)
    if not NAME.fullmatch(name) or (decoded := decode_at(text, brace)) is None:
        return None
    call = call_from_object({"name": name, "arguments": decoded[0]})
    return ([call], decoded[1]) if call is not None else None
