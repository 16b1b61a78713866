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
    """Which request a /tokenize body is: "messages" makes it a conversation, "prompt" a text;
    both or neither is neither (a 400 saying so, not one of them silently picked or a "prompt:
    Field required" that hides the other). Tags are the class names, which error paths skip
    (errors._param): `param` names the field, never the branch."""
    if isinstance(data, BaseModel):
        return _CHAT if isinstance(data, TokenizeChatRequest) else _PROMPT
    if not isinstance(data, dict):
        return _PROMPT  # not an object: the model says what it wants
    if ("messages" in data) == ("prompt" in data):
        return None
    return _CHAT if "messages" in data else _PROMPT


_PROMPT, _CHAT = TokenizeCompletionRequest.__name__, TokenizeChatRequest.__name__

# Discriminated, so each body is validated as one model only (a plain union tries both and logs
# the other's field as ignored).
TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag(_PROMPT)] | Annotated[TokenizeChatRequest, Tag(_CHAT)],
    Discriminator(_tokenize_kind, custom_error_type="prompt_or_messages",
                  custom_error_message="Send either prompt or messages: exactly one of them."),
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
