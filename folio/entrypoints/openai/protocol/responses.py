"""/v1/responses: OpenAI's Responses API shapes for text in, text out (as vLLM serves it).

Input is a string or a list of messages ({"role", "content"} with text or input_text parts);
`instructions` become a system message. Tools, background runs, stored responses and
non-text formats are refused with a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from folio.entrypoints.openai.protocol.common import OpenAIBaseModel
from folio.entrypoints.openai.protocol.unsupported import unsupported


class InputContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputContentPart]


class ResponsesRequest(OpenAIBaseModel):
    model: str | None = None
    input: str | list[InputMessage] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: unsupported((None, False), "nothing is stored") = None  # the response says store=false
    tools: unsupported((None, []), "no tools in /v1/responses yet") = None
    tool_choice: unsupported((None, "auto", "none"), "no tools in /v1/responses yet") = None
    parallel_tool_calls: bool | None = None
    previous_response_id: unsupported((None,), "responses are not stored") = None
    background: unsupported((None, False), "no background responses") = None
    include: unsupported((None, []), "no extra output data") = None
    reasoning: unsupported((None,), "no reasoning configuration") = None
    text: unsupported((None, {"format": {"type": "text"}}), "text output format only") = None
    truncation: unsupported((None, "disabled"), "prompts are never truncated") = None
    # vLLM's extras
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    seed: int | None = None
    priority: int = 0


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponsesResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
    model: str
    output: list[OutputMessage]
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] = []
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = {"format": {"type": "text"}}
    truncation: str = "disabled"
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    background: bool = False
    user: str | None = None
