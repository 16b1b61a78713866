"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated.

Text outside the calls is content: what comes before the first call, and what the model writes
between and after them (a gap of whitespace only is dropped, as is the layout between calls).
The calls end at the first one that does not parse: at the end of the output it and all that
follows are content again, so a call cut off by max_tokens loses none of its text.
"""

from __future__ import annotations

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, call_from_object, decode_at, held_back

START, END = "<tool_call>", "</tool_call>"
SPACE = " \t\r\n"


class HermesToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        start = text.find(START)
        if start < 0:
            return text if final else text[: held_back(text, START)], []
        content, calls, pos = text[:start], [], start
        while True:  # text[pos:] starts with START
            parsed = _call(text, pos + len(START))
            if parsed is None:
                break  # still being written, or not a call
            call, pos = parsed
            calls.append(call)
            following = text.find(START, pos)
            if following < 0:  # text after the last call so far
                gap = text[pos:] if final else text[pos : held_back(text, START)]
                return content + (gap if gap.strip(SPACE) else ""), calls
            gap = text[pos:following]
            content += gap if gap.strip(SPACE) else ""
            pos = following
        if not calls:
            return (text, []) if final else (content, [])
        return content + text[pos:] if final else content, calls


def _call(text: str, pos: int) -> tuple[ParsedCall, int] | None:
    """The call whose JSON starts at pos (after optional whitespace) and the end of its closing
    tag; None while it is incomplete or when it is not a call. Decoding the JSON (not searching
    for the closing tag) lets the arguments hold "</tool_call>" inside a string."""
    decoded = decode_at(text, pos)
    if decoded is None:
        return None
    value, end = decoded
    call = call_from_object(value)
    while end < len(text) and text[end] in SPACE:
        end += 1
    if call is None or not text.startswith(END, end):
        return None
    return call, end + len(END)
