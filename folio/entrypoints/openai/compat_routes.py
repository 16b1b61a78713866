"""The vLLM-compatibility parts of the app: /ping, CORS, request logging, and the routers of
vLLM's other endpoints (/v1/embeddings, /v1/responses, /v1/score, /v1/rerank), kept out of the main router."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware

from folio.entrypoints.openai.protocol import ErrorResponse, HealthResponse

if TYPE_CHECKING:
    from folio.entrypoints.openai.frontend_args import FrontendConfig
    from folio.entrypoints.openai.router import ServingState

compat_router = APIRouter()


@compat_router.get("/ping", response_model=HealthResponse, responses={503: {"model": ErrorResponse}})
@compat_router.post("/ping", response_model=HealthResponse, include_in_schema=False)
async def ping(request: Request):
    """SageMaker's health probe, as vLLM serves it: the same answer as /health."""
    from folio.entrypoints.openai.router import health

    return await health(request)


def lazy_serving(request: Request, name: str, make: Callable[[ServingState], Any]) -> Any:
    """The app's serving object `name` for an endpoint outside the main router, made from the
    main ServingState on first use (ServingState itself is shared and frozen)."""
    state = request.app.state
    serving = getattr(state, name, None)
    if serving is None:
        serving = make(state.serving)
        setattr(state, name, serving)
    return serving


def include_compat_routes(app: FastAPI) -> None:
    app.include_router(compat_router)
    for module_name in ("folio.entrypoints.openai.serving_embedding", "folio.entrypoints.openai.serving_responses",
                        "folio.entrypoints.openai.serving_score"):
        try:
            module = __import__(module_name, fromlist=["router"])
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        app.include_router(module.router)


def add_cors(app: FastAPI, frontend: FrontendConfig) -> None:
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(frontend.allowed_origins),
        allow_credentials=frontend.allow_credentials,
        allow_methods=list(frontend.allowed_methods),
        allow_headers=list(frontend.allowed_headers),
    )


def log_requests(state: ServingState, frontend: FrontendConfig) -> None:
    """--enable-log-requests: every endpoint that adds engine requests logs them."""
    if not frontend.enable_log_requests:
        return
    from folio.entrypoints.openai.request_logger import RequestLogger

    logger = RequestLogger(frontend.max_log_len)
    for serving in (state.completion, state.chat):
        serving.request_logger = logger
