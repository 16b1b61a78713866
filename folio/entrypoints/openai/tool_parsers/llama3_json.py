"""Llama 3.x JSON tool calls: the reply is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`), several separated by `;`.

The calls are the complete call objects at the start of the reply. Once one has been read it
stays a call (a stream cannot take it back): at the end of the output, whatever follows the
calls and is not one (a call cut off by max_tokens, another JSON value, words) is content.
"""

from __future__ import annotations

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser, call_from_object, decode_at

PYTHON_TAG = "<|python_tag|>"
SEPARATORS = " \t\r\n;,"


class Llama3JsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        pos = len(text) - len(text.lstrip())
        if text.startswith(PYTHON_TAG, pos):
            pos += len(PYTHON_TAG)
        elif not text.startswith("{", pos):
            body = text[pos:]
            if not final and (not body or PYTHON_TAG.startswith(body)):
                return "", []  # could still become a call
            return text, []
        calls: list[ParsedCall] = []
        while (decoded := decode_at(text, pos)) is not None:
            call = call_from_object(decoded[0], "parameters")
            if call is None:
                break
            calls.append(call)
            pos = decoded[1]
            while pos < len(text) and text[pos] in SEPARATORS:
                pos += 1
        if not final:
            return "", calls
        if not calls:
            return text, []
        return text[pos:], calls
