"""Tools in chat requests and responses: definitions, tool_choice, tool calls and their deltas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from folio.entrypoints.openai.protocol.unsupported import NestedRequestModel


def _is_none(value: Any) -> bool:
    return value is None


class FunctionDefinition(NestedRequestModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(NestedRequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(NestedRequestModel):
    name: str


class NamedToolChoice(NestedRequestModel):
    type: Literal["function"] = "function"
    function: NamedFunction


def _known_tool_choice_type(value: Any) -> Any:
    """A tool_choice object of another type (OpenAI's "allowed_tools", "custom", ...) is refused in
    words, not with pydantic's account of the union's failed branches."""
    kind = value.get("type", "function") if isinstance(value, dict) else "function"
    if kind != "function":
        raise ValueError(f"tool_choice of type {kind!r} is not supported; use \"none\", \"auto\", \"required\" "
                         "or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    return value


ToolChoice = Annotated[Literal["none", "auto", "required"] | NamedToolChoice, BeforeValidator(_known_tool_choice_type)]


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=_is_none)
    arguments: str | None = Field(default=None, exclude_if=_is_none)


class DeltaToolCall(BaseModel):
    """A streamed piece of tool call `index`: the first carries id, type and name."""

    index: int
    id: str | None = Field(default=None, exclude_if=_is_none)
    type: Literal["function"] | None = Field(default=None, exclude_if=_is_none)
    function: DeltaFunctionCall | None = Field(default=None, exclude_if=_is_none)
