"""/tokenize and /detokenize (vLLM's extras): text or a conversation to token ids and back."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Discriminator, Field, Tag

from folio.entrypoints.openai.protocol.chat import ChatMessage
from folio.entrypoints.openai.protocol.common import OpenAIBaseModel, TokenId


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


def _tokenize_kind(data: Any) -> str | None:
    """Which request a /tokenize body is: "messages" makes it a conversation, else a prompt; both
    at once is neither (a 400, not one of them silently picked)."""
    if isinstance(data, BaseModel):
        return "chat" if isinstance(data, TokenizeChatRequest) else "completion"
    if isinstance(data, dict):
        if "messages" in data:
            return None if "prompt" in data else "chat"
    return "completion"


# Discriminated, so each body is validated as one model only (a plain union tries both and logs
# the other's field as ignored).
TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag("completion")] | Annotated[TokenizeChatRequest, Tag("chat")],
    Discriminator(_tokenize_kind, custom_error_type="prompt_or_messages",
                  custom_error_message="Send either prompt or messages, not both."),
]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[TokenId]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str
