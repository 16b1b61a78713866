"""POST /v1/embeddings: texts or token ids in, one pooled, normalized vector each out.

The engine pools its model's final hidden states between two generation steps
(LLMEngine.embed, worker/pooler.py): last token by default, as vLLM's embedding runner does for a
decoder checkpoint, or the mean (`--pooler-config '{"pooling_type": "MEAN"}'` or the request's
`pooling_type`).
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

from fastapi import APIRouter, Request

from folio.engine.async_llm import AsyncLLM
from folio.entrypoints.openai.errors import BadRequestError, from_engine_error
from folio.entrypoints.openai.protocol import ErrorResponse, make_usage
from folio.entrypoints.openai.protocol.embedding import EmbeddingData, EmbeddingRequest, EmbeddingResponse
from folio.entrypoints.openai.serving_engine import EnginePrompt, OpenAIServing, random_id
from folio.pooling_params import PoolingParams

router = APIRouter()


class OpenAIServingEmbedding(OpenAIServing):
    def __init__(self, engine: AsyncLLM, model_name: str, models: Any = None) -> None:
        super().__init__(engine, model_name, models=models)
        self.pooler_config = engine.model_config.pooler_config

    def check_base_model(self, model: str | None) -> None:
        """The served model (or None); a LoRA adapter's name is refused: pooling runs the base
        model only, so an adapter's embeddings would silently be the base model's."""
        if self.check_model(model) is not None:
            raise BadRequestError(f"{model!r} is a LoRA adapter; embeddings come from the base model only.",
                                  param="model")

    async def create(self, request: EmbeddingRequest) -> EmbeddingResponse:
        self.check_base_model(request.model)
        if request.dimensions is not None:
            raise BadRequestError("dimensions is not supported: folio returns full-size embeddings.",
                                  param="dimensions")
        prompts = [self.truncate_prompt(p, request) for p in await self._prompts(request)]
        for prompt in prompts:
            if not prompt.token_ids:
                raise BadRequestError("The input is empty: at least one token is needed.", param="input")
            if len(prompt.token_ids) > self.max_model_len:
                raise BadRequestError(
                    f"This model's maximum context length is {self.max_model_len} tokens, and the input "
                    f"is {len(prompt.token_ids)} tokens long.", param="input", code="context_length_exceeded")
        config = PoolingParams(normalize=request.normalize, pooling_type=request.pooling_type).resolve(
            self.pooler_config
        )
        request_id = random_id("embd")
        try:
            vectors = await self.engine.embed(request_id, [p.token_ids for p in prompts], config)
        except Exception as e:
            raise from_engine_error(e) from None
        num_tokens = sum(len(p.token_ids) for p in prompts)
        data = [EmbeddingData(index=i, embedding=_encode(v, request.encoding_format)) for i, v in enumerate(vectors)]
        return EmbeddingResponse(id=request_id, created=int(time.time()), model=self.model_name, data=data,
                                 usage=make_usage(num_tokens, 0, 0))

    async def _prompts(self, request: EmbeddingRequest) -> list[EnginePrompt]:
        value = request.input
        if isinstance(value, str):
            value = [value]
        if all(isinstance(v, int) for v in value):
            value = [value]
        prompts = []
        for item in value:
            if isinstance(item, str):
                token_ids = await self.encode_async(item, request.add_special_tokens, param="input",
                                                    truncating=request.truncate_prompt_tokens is not None)
                prompts.append(EnginePrompt(token_ids, item))
            else:
                self.check_token_ids(item, "input")
                prompts.append(EnginePrompt(list(item)))
        return prompts


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _serving(request: Request) -> OpenAIServingEmbedding:
    from folio.entrypoints.openai.compat_routes import lazy_serving

    return lazy_serving(request, "embedding", lambda s: OpenAIServingEmbedding(s.engine, s.completion.model_name, s.models))


@router.post("/v1/embeddings", response_model=EmbeddingResponse,
             responses={status: {"model": ErrorResponse} for status in (400, 401, 404, 500, 503)})
async def create_embedding(body: EmbeddingRequest, request: Request) -> Any:
    return await _serving(request).create(body)
