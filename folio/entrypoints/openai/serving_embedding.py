"""POST /v1/embeddings: texts or token ids in, one pooled, normalized vector each out.

The engine pools its model's final hidden states between two generation steps
(LLMEngine.embed, worker/pooler.py): last token by default, as vLLM's embedding runner does for a
decoder checkpoint, or the mean (`--pooler-config '{"pooling_type": "MEAN"}'` or the request's
`pooling_type`).

The engine embeds a request a chunk of about one step's tokens at a time, generation going on
between chunks (AsyncLLM.embed); one request is capped (--max-embedding-inputs,
--max-embedding-tokens), its size checked before its texts are tokenized where their length already tells, and many texts are
tokenized off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from typing import Any

from fastapi import APIRouter, Request

from folio.engine.async_llm import AsyncLLM
from folio.entrypoints.openai.disconnect import cancel_on_disconnect
from folio.entrypoints.openai.errors import BadRequestError, from_engine_error
from folio.entrypoints.openai.protocol import ErrorResponse, make_usage
from folio.entrypoints.openai.protocol.embedding import EmbeddingData, EmbeddingRequest, EmbeddingResponse
from folio.entrypoints.openai.serving_engine import ENCODE_OFF_LOOP_CHARS, EnginePrompt, OpenAIServing, random_id
from folio.pooling_params import PoolingParams

router = APIRouter()

# OpenAI's limits for one embeddings request, the defaults of --max-embedding-inputs and
# --max-embedding-tokens: 2048 inputs, 300,000 tokens over all of them. The token cap bounds the
# engine work one call may ask for (~35 s of the CPU demo model, now spread over chunks between
# generation steps) and its response; it is at least max_model_len, so any one input that fits the
# context is taken.
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 300_000


class OpenAIServingEmbedding(OpenAIServing):
    def __init__(self, engine: AsyncLLM, model_name: str, models: Any = None, *,
                 max_inputs: int = MAX_INPUTS, max_tokens: int = MAX_INPUT_TOKENS) -> None:
        super().__init__(engine, model_name, models=models)
        self.pooler_config = engine.model_config.pooler_config
        self.max_inputs = max_inputs  # per request (--max-embedding-inputs)
        self.max_tokens = max_tokens  # over a request's inputs (--max-embedding-tokens)

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
        value = request.input
        if isinstance(value, str) or all(isinstance(v, int) for v in value):
            value = [value]
        self.check_input_count(len(value), "input")
        prompts = await self.input_prompts(value, request, "input")
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

    async def input_prompts(self, items: list[str | list[int]], request: Any, param: str) -> list[EnginePrompt]:
        """Texts (tokenized) and token ids to embed, truncated as the request asks; more than
        max_tokens tokens in all is a 400 naming `param`, told before tokenizing when the
        texts' lengths already show it (at_least_tokens)."""
        texts = [item for item in items if isinstance(item, str)]
        if texts:
            self.require_tokenizer(param, "text inputs")
        if request.truncate_prompt_tokens is None:  # a lower bound on each input's tokens, without tokenizing
            least = [self.at_least_tokens(item) if isinstance(item, str) else len(item) for item in items]
            for item, n in zip(items, least):
                if isinstance(item, str) and n > self.max_model_len:
                    raise self.too_long_text(item, n, param, param)
            self._check_total_tokens(sum(least), param, "at least ")

        special = getattr(request, "add_special_tokens", True)  # (score and rerank requests: True)

        def tokenize() -> list[EnginePrompt]:
            prompts = []
            for item in items:
                if isinstance(item, str):
                    prompts.append(EnginePrompt(self.encode(item, special, param), item))
                else:
                    self.check_token_ids(item, param)
                    prompts.append(EnginePrompt(list(item)))
            return prompts

        # Many short texts add up: tokenized on a worker thread past ENCODE_OFF_LOOP_CHARS in all.
        off_loop = sum(map(len, texts)) >= ENCODE_OFF_LOOP_CHARS
        prompts = await asyncio.to_thread(tokenize) if off_loop else tokenize()
        prompts = [self.truncate_prompt(p, request) for p in prompts]
        self._check_total_tokens(sum(len(p.token_ids) for p in prompts), param)
        return prompts

    def check_input_count(self, count: int, param: str) -> None:
        if count > self.max_inputs:
            raise BadRequestError(f"{param} has {count} items; at most {self.max_inputs} are taken in one request "
                                  "(the server's --max-embedding-inputs).", param=param)

    def _check_total_tokens(self, num_tokens: int, param: str, qualifier: str = "") -> None:
        limit = max(self.max_tokens, self.max_model_len)
        if num_tokens > limit:
            raise BadRequestError(f"The {param} is {qualifier}{num_tokens} tokens in all; at most {limit} may be "
                                  "embedded in one request (the server's --max-embedding-tokens).", param=param)


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _serving(request: Request) -> OpenAIServingEmbedding:
    from folio.entrypoints.openai.compat_routes import lazy_serving

    return lazy_serving(request, "embedding", lambda s: OpenAIServingEmbedding(
        s.engine, s.completion.model_name, s.models, **caps(request)))


def caps(request: Request) -> dict[str, int]:
    """The server's per-request embedding caps (FrontendConfig), as keyword arguments."""
    frontend = getattr(request.app.state, "frontend", None)
    if frontend is None:  # an app built without a config
        return {}
    return {"max_inputs": frontend.max_embedding_inputs, "max_tokens": frontend.max_embedding_tokens}


@router.post("/v1/embeddings", response_model=EmbeddingResponse,
             responses={status: {"model": ErrorResponse} for status in (400, 401, 404, 500, 503)})
async def create_embedding(body: EmbeddingRequest, request: Request) -> Any:
    # cancelled when the client leaves: no further chunk of its inputs is embedded (AsyncLLM.embed)
    return await cancel_on_disconnect(request, _serving(request).create(body))
