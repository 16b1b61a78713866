"""Reasoning parsers: split a thinking model's `<think>…</think>` from its answer."""

from __future__ import annotations

from folio.entrypoints.openai.reasoning_parsers.think import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
)

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    if name not in REASONING_PARSERS:
        raise ValueError(f"Unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}.")
    return REASONING_PARSERS[name]()


__all__ = ["REASONING_PARSERS", "ReasoningParser", "get_reasoning_parser"]
