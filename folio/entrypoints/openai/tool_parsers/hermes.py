"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated."""

from __future__ import annotations

import json

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, call_from_object, held_back

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        start = text.find(START)
        if start < 0:
            return text if final else text[: held_back(text, START)], []
        calls: list[ParsedCall] = []
        pos = start
        while (open_at := text.find(START, pos)) >= 0:
            close_at = text.find(END, open_at)
            if close_at < 0:
                break  # still being written
            call = _call(text[open_at + len(START) : close_at])
            if call is None:
                break
            calls.append(call)
            pos = close_at + len(END)
        if final and not calls:
            return text, []  # a marker with no parsable call: the model's words, not a call
        return text[:start], calls


def _call(body: str) -> ParsedCall | None:
    try:
        return call_from_object(json.loads(body))
    except json.JSONDecodeError:
        return None
