"""POST /score, /v1/score, /rerank, /v1/rerank, /v2/rerank: vLLM's scoring endpoints for an
embedding model: the cosine similarity of two texts' embeddings (worker/pooler.py).

Score pairs text_1 with text_2 one to many or one to one; rerank orders documents by their score
against the query (top_n, 0 = all).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from folio.entrypoints.llm_pooling import cosine
from folio.entrypoints.openai.disconnect import cancel_on_disconnect
from folio.entrypoints.openai.errors import BadRequestError, from_engine_error
from folio.entrypoints.openai.protocol import ErrorResponse, OpenAIBaseModel, UsageInfo
from folio.entrypoints.openai.serving_embedding import OpenAIServingEmbedding, caps
from folio.entrypoints.openai.serving_engine import random_id
from folio.pooling_params import PoolerConfig

router = APIRouter()
Text = str | list[str]


class ScoreRequest(OpenAIBaseModel):
    model: str | None = None
    text_1: Text
    text_2: Text
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankRequest(OpenAIBaseModel):
    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[str] = Field(min_length=1)
    top_n: int = Field(default=0, ge=0)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: UsageInfo
    results: list[RerankResult]


class OpenAIServingScore(OpenAIServingEmbedding):
    async def scores(self, request: Any, firsts: list[str], seconds: list[str]) -> tuple[list[float], int]:
        """Cosine similarity of each (first, second) pair of texts, and the tokens read."""
        self.check_base_model(request.model)
        # the caps of /v1/embeddings (max_inputs pairs, max_tokens tokens), named by the list's field
        param = "documents" if isinstance(request, RerankRequest) else "text_2"
        self.check_input_count(len(seconds), param)
        named = _named_texts(request)  # each distinct text embedded once
        self._check_before_tokenizing(named, request)
        texts = list(named)
        prompts = await self.input_prompts(texts, request, param)
        for text, prompt in zip(texts, prompts):
            self._check_length(len(prompt.token_ids), named[text])
        config = PoolerConfig(self.pooler_config.pooling_type, normalize=True)
        try:
            vectors = await self.engine.embed(random_id("score"), [p.token_ids for p in prompts], config)
        except Exception as e:
            raise from_engine_error(e) from None
        by_text = dict(zip(texts, vectors))
        scores = [cosine(by_text[a], by_text[b]) for a, b in zip(firsts, seconds)]
        return scores, sum(len(p.token_ids) for p in prompts)

    def _check_before_tokenizing(self, named: dict[str, str], request: Any) -> None:
        """An empty text, or one its characters show is past the context (unless truncated): a
        400 naming that text's field, before anything is tokenized."""
        for text, param in named.items():
            if not text:
                raise BadRequestError(f"{param} is empty: texts to score must not be empty.", param=param)
            least = self.at_least_tokens(text) if request.truncate_prompt_tokens is None else 0
            if least > self.max_model_len:
                raise self.too_long_text(text, least, param, param)

    def _check_length(self, num_tokens: int, param: str) -> None:
        # Past the context, the engine would refuse it with a message that names no field.
        if num_tokens > self.max_model_len:
            raise BadRequestError(f"This model's maximum context length is {self.max_model_len} tokens, and "
                                  f"{param} is {num_tokens} tokens long.", param=param,
                                  code="context_length_exceeded")


def _named_texts(request: Any) -> dict[str, str]:
    """Each distinct text of a score or rerank request, in order, with the field it came first
    from as the client wrote it ("query", "documents[2]", "text_1", "text_2[0]")."""
    if isinstance(request, RerankRequest):
        fields: list[tuple[str, Text]] = [("query", request.query), ("documents", request.documents)]
    else:
        fields = [("text_1", request.text_1), ("text_2", request.text_2)]
    named: dict[str, str] = {}
    for name, value in fields:
        if isinstance(value, str):
            named.setdefault(value, name)
        else:
            for i, text in enumerate(value):
                named.setdefault(text, f"{name}[{i}]")
    return named


def _pairs(text_1: Text, text_2: Text) -> tuple[list[str], list[str]]:
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if len(firsts) == 1 and len(seconds) > 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds) or not firsts:
        raise BadRequestError("text_1 must be one text, or as many texts as text_2.", param="text_1")
    return firsts, seconds


def _serving(request: Request) -> OpenAIServingScore:
    from folio.entrypoints.openai.compat_routes import lazy_serving

    return lazy_serving(request, "score", lambda s: OpenAIServingScore(
        s.engine, s.completion.model_name, s.models, **caps(request)))


_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 500, 503)}


@router.post("/v1/score", response_model=ScoreResponse, responses=_ERRORS)
@router.post("/score", response_model=ScoreResponse, include_in_schema=False)
async def create_score(body: ScoreRequest, request: Request) -> Any:
    # cancelled when the client leaves: no further chunk of its texts is embedded (AsyncLLM.embed)
    return await cancel_on_disconnect(request, _score(_serving(request), body))


async def _score(serving: OpenAIServingScore, body: ScoreRequest) -> ScoreResponse:
    firsts, seconds = _pairs(body.text_1, body.text_2)
    scores, tokens = await serving.scores(body, firsts, seconds)
    return ScoreResponse(id=random_id("score"), created=int(time.time()), model=serving.model_name,
                         data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
                         usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens))


@router.post("/v1/rerank", response_model=RerankResponse, responses=_ERRORS)
@router.post("/rerank", response_model=RerankResponse, include_in_schema=False)
@router.post("/v2/rerank", response_model=RerankResponse, include_in_schema=False)
async def create_rerank(body: RerankRequest, request: Request) -> Any:
    return await cancel_on_disconnect(request, _rerank(_serving(request), body))


async def _rerank(serving: OpenAIServingScore, body: RerankRequest) -> RerankResponse:
    scores, tokens = await serving.scores(body, [body.query] * len(body.documents), body.documents)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if body.top_n:
        order = order[: body.top_n]
    results = [RerankResult(index=i, document=RerankDocument(text=body.documents[i]), relevance_score=scores[i])
               for i in order]
    return RerankResponse(id=random_id("rerank"), model=serving.model_name,
                          usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens), results=results)
