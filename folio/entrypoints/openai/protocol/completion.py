"""/v1/completions: the request, the response and the stream chunk, in OpenAI's legacy shapes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator
from pydantic_core import SchemaValidator, core_schema

from folio.entrypoints.openai.protocol.common import SamplingRequest, TokenId, UsageInfo, prompt_in_words

# A prompt is text, a batch of texts, token ids, or a batch of token id lists.
Prompt = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)
FinishReason = Literal["stop", "length", "abort", "tool_calls"]

# Token ids in one strict pass (a bool is no int here either); `ge=0` is checked after it by a
# min, which costs less than pydantic's per-item constraint.
_PLAIN_INTS = SchemaValidator(core_schema.list_schema(core_schema.int_schema(strict=True), strict=True))


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _token_ids_at_once(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A prompt of token ids, what benchmarks send, in one pass: the union's smart mode would
        also try list[str] and list[list[TokenId]] on it, building one error per token before
        list[TokenId] wins (~120 us for a 1,000-token prompt, against ~20 here). Anything else,
        and any list this refuses, goes through the union: the same values, the same errors."""
        if value.__class__ is list and value and value[0].__class__ is int:
            try:
                token_ids = _PLAIN_INTS.validate_python(value)
            except ValidationError:
                return prompt_in_words(handler, value, "prompt")
            if min(token_ids) >= 0:
                return token_ids
        return prompt_in_words(handler, value, "prompt")


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
