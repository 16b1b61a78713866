"""The HTTP routes: thin wrappers that hand typed requests to the serving objects.

Every route documents the error statuses it can answer (always ErrorResponse), so the
OpenAPI schema at /openapi.json says what the server really does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from folio.engine.async_llm import AsyncLLM
from folio.engine.metrics import CONTENT_TYPE
from folio.entrypoints.openai.disconnect import cancel_on_disconnect
from folio.entrypoints.openai.errors import (
    NotFoundError,
    ServiceUnavailableError,
    lone_surrogate_error,
    may_hold_lone_surrogate,
)
from folio.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    VersionResponse,
)
from folio.entrypoints.openai.protocol.lora import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from folio.entrypoints.openai.serving_chat import OpenAIServingChat
from folio.entrypoints.openai.serving_completion import OpenAIServingCompletion
from folio.entrypoints.openai.serving_models import OpenAIServingModels
from folio.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from folio.version import __version__


@dataclass(frozen=True)
class ServingState:
    engine: AsyncLLM
    completion: OpenAIServingCompletion
    chat: OpenAIServingChat
    models: OpenAIServingModels
    tokenization: OpenAIServingTokenization
    allow_runtime_lora_updating: bool = False


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


# Each event as an SSE parser sees it: its data line (JSON text) and its event name.
_EVENT_STREAM = {200: {"content": {"text/event-stream": {"schema": {
                           "type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}}},
                       "description": "A JSON object, or with stream=true server-sent events"}}
_GENERATE_ERRORS = {**_EVENT_STREAM, **_errors(400, 401, 404, 500, 503)}

router = APIRouter()


async def refuse_lone_surrogates(request: Request) -> None:
    """Every route's first dependency (build_app): a 400 for a JSON body with a lone UTF-16
    surrogate in any string, key or value, at any depth (free-form dicts included), before the
    body is validated or reaches a tokenizer or an echoed response. Dependencies run after
    FastAPI read and decoded the body, and Starlette keeps both: nothing is read or decoded twice,
    and a body without a surrogate escape (or raw surrogate bytes) costs one byte scan."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    body = await request.body()
    if not body or not may_hold_lone_surrogate(body):
        return
    try:
        data = await request.json()
    except (ValueError, RecursionError):  # not JSON: the route's own body parsing reports it
        return
    error = lone_surrogate_error(data)
    if error is not None:
        raise error


def _state(request: Request) -> ServingState:
    return request.app.state.serving


@router.get("/health", response_model=HealthResponse, responses=_errors(503))
async def health(request: Request) -> Any:
    """200 while the engine is running; 503 once it stopped (after an error, or shutdown)."""
    engine = _state(request).engine
    if not engine.is_running:
        reason = str(engine.dead_error or "The engine is not running.")
        return ServiceUnavailableError(reason, code="engine_unavailable").response()
    return HealthResponse()


@router.get("/version", response_model=VersionResponse, responses=_errors(401))
async def version() -> VersionResponse:
    return VersionResponse(version=__version__)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(request: Request) -> Response:
    return Response(_state(request).engine.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models", response_model=ModelList, responses=_errors(401))
async def list_models(request: Request) -> ModelList:
    return _state(request).models.list()


@router.get("/v1/models/{model:path}", response_model=ModelCard, responses=_errors(401, 404))
async def retrieve_model(model: str, request: Request) -> ModelCard:
    return _state(request).models.retrieve(model)


@router.post("/v1/completions", response_model=CompletionResponse, responses=_GENERATE_ERRORS)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    return await cancel_on_disconnect(request, _state(request).completion.create(body))


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_GENERATE_ERRORS)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    return await cancel_on_disconnect(request, _state(request).chat.create(body))


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=_errors(400, 401, 404, 503))
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    """Load a PEFT adapter from a local folder and serve it as the model `lora_name` (vLLM's
    endpoint; only with --allow-runtime-lora-updating)."""
    state = _runtime_lora_state(request)
    await state.models.load(state.engine, body.lora_name, body.lora_path, inplace=body.load_inplace)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=_errors(400, 401, 404, 503))
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    state = _runtime_lora_state(request)
    await state.models.unload(state.engine, body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _runtime_lora_state(request: Request) -> ServingState:
    state = _state(request)
    if not state.allow_runtime_lora_updating:
        raise NotFoundError("Runtime LoRA updating is off: start the server with --allow-runtime-lora-updating.",
                            code="not_found")
    return state


@router.post("/tokenize", response_model=TokenizeResponse, responses=_errors(400, 401, 404))
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    return await _state(request).tokenization.tokenize(body)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=_errors(400, 401, 404))
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    return _state(request).tokenization.detokenize(body)

