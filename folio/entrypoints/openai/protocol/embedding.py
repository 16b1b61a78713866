"""/v1/embeddings: the request and the response, in OpenAI's shapes plus vLLM's extras."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidatorFunctionWrapHandler, field_validator

from folio.entrypoints.openai.protocol.common import OpenAIBaseModel, TokenId, UsageInfo, prompt_in_words
from folio.entrypoints.openai.protocol.unsupported import unsupported

EmbeddingInput = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


class EmbeddingRequest(OpenAIBaseModel):
    model: str | None = None
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    # vLLM's extras
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    add_special_tokens: bool = True
    normalize: bool | None = None
    # Embeddings are computed between generation steps, outside the scheduler's queue: a priority
    # would be ignored, so any but 0 is a 400 naming the field (as completions refuse one on FCFS).
    priority: unsupported((0,), "embeddings run between generation steps, outside the scheduler's "
                          "queue, so they have no priority") = 0
    # folio's: "LAST" or "MEAN" pooling for this request (default: the server's pooler_config)
    pooling_type: Literal["LAST", "MEAN", "last", "mean"] | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _input_in_words(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return prompt_in_words(handler, value, "input")


class EmbeddingData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str  # a base64 string of little-endian float32 with encoding_format=base64


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo
