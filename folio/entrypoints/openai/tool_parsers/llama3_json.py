"""Llama 3.x JSON tool calls: the reply is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`), several separated by `;`."""

from __future__ import annotations

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, call_from_object, scan_json_values

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        elif not body.startswith("{"):
            if not final and (not body or PYTHON_TAG.startswith(body)):
                return "", []  # could still become a call
            return text, []
        values, rest = scan_json_values(body)
        calls = [call_from_object(v, "parameters") for v in values]
        if any(c is None for c in calls) or (final and (not calls or body[rest:].strip())):
            return (text, []) if final else ("", [])
        return "", [c for c in calls if c is not None]
