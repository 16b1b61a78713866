"""/tokenize and /detokenize (vLLM's extras): text or a conversation to token ids and back."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

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


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


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
