"""/v1/completions: the request, the response and the stream chunk, in OpenAI's legacy shapes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from folio.entrypoints.openai.protocol.common import SamplingRequest, TokenId, UsageInfo

# A prompt is text, a batch of texts, token ids, or a batch of token id lists.
Prompt = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)
FinishReason = Literal["stop", "length", "abort", "tool_calls"]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)
    best_of: int | None = None
    suffix: str | None = None


class CompletionLogprobs(BaseModel):
    """Legacy log-probs: one entry per token; the first prompt token (echo) has no log-prob."""

    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop string or token that ended it


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionStreamResponse(BaseModel):
    """One server-sent event; the last (with include_usage) has no choices and the usage."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
