"""StructuredOutputsConfig: which grammar backend constrains structured outputs, engine-wide."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance")
REASONING_PARSERS = ("qwen3", "deepseek_r1")  # the server's --reasoning-parser names


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """vLLM's `structured_outputs_config` / `--structured-outputs-config`.

    backend: "xgrammar" (the default that "auto" picks), "guidance" (llguidance) or "auto".
    disable_any_whitespace: JSON grammars allow no free whitespace for every request (a request
    can also ask for it in its own StructuredOutputsParams).
    max_compile_threads: threads that compile grammars off the engine's step loop.
    reasoning_parser: a reasoning model's format ("qwen3", "deepseek_r1"; `folio serve
    --reasoning-parser` sets it): grammars apply after the model's `</think>`, so it reasons
    first, as vLLM does; enable_in_reasoning: the grammar from the first token all the same.
    """

    backend: str = "auto"
    disable_any_whitespace: bool = False
    max_compile_threads: int = 2
    reasoning_parser: str | None = None
    enable_in_reasoning: bool = False

    def __post_init__(self) -> None:
        if self.backend not in STRUCTURED_OUTPUT_BACKENDS:
            raise ValueError(
                f"structured_outputs_config.backend must be one of "
                f"{', '.join(STRUCTURED_OUTPUT_BACKENDS)}, got {self.backend!r}."
            )
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError("structured_outputs_config.disable_any_whitespace must be a boolean.")
        if isinstance(self.max_compile_threads, bool) or not isinstance(self.max_compile_threads, int) or self.max_compile_threads < 1:
            raise ValueError("structured_outputs_config.max_compile_threads must be a positive integer.")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"structured_outputs_config.reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}.")
        if not isinstance(self.enable_in_reasoning, bool):
            raise ValueError("structured_outputs_config.enable_in_reasoning must be a boolean.")

    @classmethod
    def from_value(cls, value: Any) -> StructuredOutputsConfig:
        """The config from None (defaults), itself, or a dict of its fields."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError("structured_outputs_config must be a dict of backend options.")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"Unknown structured_outputs_config field(s): {', '.join(unknown)}; known: "
                f"{', '.join(sorted(known))}."
            )
        return cls(**value)
