"""Mistral tool calls: content, then `[TOOL_CALLS]` and a JSON list of {"name", "arguments"}."""

from __future__ import annotations

import json

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, call_from_object, held_back

MARKER = "[TOOL_CALLS]"


class MistralToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        start = text.find(MARKER)
        if start < 0:
            return text if final else text[: held_back(text, MARKER)], []
        body = text[start + len(MARKER) :].strip()
        try:
            items = json.loads(body)
        except json.JSONDecodeError:
            return (text, []) if final else (text[:start], [])
        items = items if isinstance(items, list) else [items]
        calls = [call_from_object(item) for item in items]
        if not calls or any(c is None for c in calls):
            return (text, []) if final else (text[:start], [])
        return text[:start], [c for c in calls if c is not None]
