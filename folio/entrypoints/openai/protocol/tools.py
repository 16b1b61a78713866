"""Tools in chat requests and responses: definitions, tool_choice, tool calls and their deltas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

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


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


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
