"""/v1/chat/completions: the request, the response and the stream chunk, in OpenAI's shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from folio.entrypoints.openai.protocol.common import SamplingRequest, UsageInfo
from folio.entrypoints.openai.protocol.completion import FinishReason
from folio.entrypoints.openai.protocol.tools import DeltaToolCall, ToolCall, ToolChoice, ToolDefinition
from folio.entrypoints.openai.protocol.unsupported import UnsupportedChatFields

# OpenAI's cap on top_logprobs.
MAX_TOP_LOGPROBS = 20


class ChatContentPart(BaseModel):
    """A part of a message's content; only {"type": "text", "text": ...} can be rendered."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """A message as the chat template sees it: extra keys (tool_calls, ...) reach the template."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[ChatContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequest, UnsupportedChatFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # vLLM's extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Tools (serving_chat.py / tool_choice.py): None means "auto" with tools, "none" without.
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = True


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = []


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] = []
    reasoning_content: str | None = None  # with --reasoning-parser: the model's thinking


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


def _is_none(value: Any) -> bool:
    return value is None


class DeltaMessage(BaseModel):
    """What a chunk adds to the message: {"role", "content": ""} first, then {"content": ...},
    and {} beside the finish_reason. Fields left None are left out, as in OpenAI's chunks."""

    role: Literal["assistant"] | None = Field(default=None, exclude_if=_is_none)
    content: str | None = Field(default=None, exclude_if=_is_none)
    reasoning_content: str | None = Field(default=None, exclude_if=_is_none)
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=_is_none)


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(BaseModel):
    """One server-sent event; the last (with include_usage) has no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None

