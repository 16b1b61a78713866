"""ToolParser: split a model's text into plain content and the tool calls it wrote.

A parser sees the whole text so far (streaming calls it again as text grows) and answers
`(content, calls)`. Streaming needs both to grow only by appending: content stops where a
tool-call region starts (a partial marker at the end is held back), and a call appears only once
it is complete, and then stays (a stream cannot take back a call it sent). At the end
(final=True) a tool-call region that does not parse is content again, so nothing the model wrote
is lost.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text


class ToolParser:
    # Whether the model's markers are special tokens, which the text must keep to be parsed.
    keeps_special_tokens = False

    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        raise NotImplementedError

    def call_id(self) -> str:
        """The id of a call it read."""
        return f"chatcmpl-tool-{uuid.uuid4().hex}"


def held_back(text: str, marker: str) -> int:
    """Where content must stop so that a marker cut at the end of text is not streamed:
    len(text) minus the longest suffix of text that is a proper prefix of marker."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return len(text)


def call_from_object(obj: Any, arguments_key: str = "arguments") -> ParsedCall | None:
    """A call from {"name": ..., arguments_key: {...}} (vLLM's parsers also take "parameters")."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, obj.get("parameters", obj.get("arguments", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at pos (after optional whitespace) and where it ends; None when
    there is none there (yet)."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None


_DECODER = json.JSONDecoder()
