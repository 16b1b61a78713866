"""Tool-call parsers for tool_choice "auto": each reads one model family's own tool-call format."""

from __future__ import annotations

from folio.entrypoints.openai.tool_parsers.base import ParsedCall, ToolParser
from folio.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from folio.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from folio.entrypoints.openai.tool_parsers.mistral import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}


def get_tool_parser(name: str) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ValueError(f"Unknown tool call parser {name!r}; known: {', '.join(sorted(TOOL_PARSERS))}.")
    return TOOL_PARSERS[name]()


__all__ = ["TOOL_PARSERS", "ParsedCall", "ToolParser", "get_tool_parser"]
