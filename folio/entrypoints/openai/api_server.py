"""The OpenAI-compatible server: `folio serve` or `python -m folio.entrypoints.openai.api_server`.

build_app() assembles the FastAPI app around an AsyncLLM (tests call it directly); run_server()
loads the engine, binds the socket and runs uvicorn. On SIGTERM (or Ctrl-C) uvicorn stops
accepting, in-flight requests get --shutdown-timeout seconds to finish, what is left is
aborted, the engine thread stops, and the process exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from folio.engine.arg_utils import EngineArgs
from folio.engine.async_llm import AsyncLLM
from folio.engine.engine_core import EngineProcess
from folio.entrypoints.openai.auth import APIKeyMiddleware
from folio.entrypoints.openai.dashboard import install_dashboard
from folio.entrypoints.openai.cli_args import ServerConfig, engine_process_wanted, make_arg_parser
from folio.entrypoints.openai.compat_routes import add_cors, include_compat_routes, log_requests
from folio.entrypoints.openai.errors import install_error_handlers
from folio.entrypoints.openai.protocol.unsupported import IgnoredFieldsLog
from folio.entrypoints.openai.router import ServingState, refuse_lone_surrogates, router
from folio.entrypoints.openai.serving_chat import OpenAIServingChat
from folio.entrypoints.openai.serving_completion import OpenAIServingCompletion
from folio.entrypoints.openai.serving_models import OpenAIServingModels
from folio.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from folio.engine.startup_heap import freeze_startup_heap
from folio.logger import init_logger
from folio.transformers_utils.chat_template import resolve_chat_template
from folio.version import __version__

logger = init_logger("folio.entrypoints.openai.api_server")  # also when run as __main__


def build_app(engine: AsyncLLM, config: ServerConfig | None = None) -> FastAPI:
    """The app for one engine; its lifespan starts the engine thread and stops it."""
    config = config or ServerConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            await app.state.serving.models.load_static(engine, config.lora_modules)
            yield
        finally:
            await engine.shutdown()

    frontend = config.frontend
    docs: dict[str, Any] = dict(docs_url=None, redoc_url=None, openapi_url=None) if frontend.disable_fastapi_docs else {}
    # The app's dependencies run first for every route it includes, the compat routers' too.
    app = FastAPI(title="folio", version=__version__, lifespan=lifespan,
                  dependencies=[Depends(refuse_lone_surrogates)],
                  description="An OpenAI-compatible API for one model.", **docs)
    app.state.serving = _serving_state(engine, config)
    app.state.frontend = frontend  # what endpoints outside the main router read (the embedding caps)
    app.include_router(router)
    include_compat_routes(app)
    if config.dashboard:
        install_dashboard(app, engine)
    install_error_handlers(app)
    app.add_middleware(IgnoredFieldsLog)  # outside the 500s: a failed request logs no ignored fields
    engine.metrics.export_vllm = frontend.metrics_compat == "vllm"
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    add_cors(app, frontend)  # outermost, as in vLLM: preflights never need the key
    app.openapi = lambda: _openapi(app)
    return app


def _serving_state(engine: AsyncLLM, config: ServerConfig) -> ServingState:
    model = engine.model_config
    template = resolve_chat_template(model.tokenizer, engine.tokenizer, config.chat_template)
    if template is None:
        logger.warning("The model has no chat template: /v1/chat/completions will answer 400. "
                       "Pass one with --chat-template.")
    name = model.served_model_name
    models = OpenAIServingModels(name, model.model, model.max_model_len, lora_enabled=engine.lora_enabled)
    if config.lora_modules and not engine.lora_enabled:
        raise ValueError("--lora-modules needs --enable-lora.")
    state = ServingState(
        engine=engine,
        completion=OpenAIServingCompletion(engine, name, models=models),
        chat=OpenAIServingChat(
            engine,
            name,
            template,
            models=models,
            tool_parser=config.tool_call_parser if config.enable_auto_tool_choice else None,
            reasoning_parser=config.reasoning_parser,
        ),
        models=models,
        tokenization=OpenAIServingTokenization(engine, name, template, models=models),
        allow_runtime_lora_updating=config.allow_runtime_lora_updating,
    )
    log_requests(state, config.frontend)
    return state


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, minus the 422 it documents by default: validation errors are 400s."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
    return app.openapi_schema


# ---- running it ---------------------------------------------------------------------------


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a taken port fails at once; port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"Cannot listen on {host}:{port}: {e.strerror}.") from None
    sock.set_inheritable(True)
    return sock


def run_server(args: argparse.Namespace, core: EngineProcess | None = None) -> int:
    """Serve until SIGTERM/SIGINT. `core`: an engine process already started (folio serve starts
    it before importing this module); without one, --engine-process decides (unset: a process on
    a GPU, a thread on the CPU)."""
    config = ServerConfig.from_cli_args(args)
    engine_args = EngineArgs.from_cli_args(args)
    try:
        sock = bind_socket(config.host, config.port)
    except ValueError:
        if core is not None:
            core.close()
        raise
    if core is None and engine_process_wanted(config.engine_process, engine_args.device,
                                              engine_args.tensor_parallel_size):
        core = EngineProcess.from_engine_args(engine_args)
    if core is not None:
        engine = AsyncLLM(core=core, max_waiting_requests=config.max_waiting_requests)
    else:
        engine = AsyncLLM.from_engine_args(engine_args, max_waiting_requests=config.max_waiting_requests)
    app = build_app(engine, config)
    server = uvicorn.Server(uvicorn.Config(
        app,
        log_level=config.log_level,
        access_log=config.access_log,
        timeout_graceful_shutdown=config.shutdown_timeout,
        lifespan="on",
        root_path=config.frontend.root_path,
        ssl_keyfile=config.frontend.ssl_keyfile,
        ssl_certfile=config.frontend.ssl_certfile,
        ssl_ca_certs=config.frontend.ssl_ca_certs,
    ))
    host, port = sock.getsockname()[:2]
    if not config.api_key and host not in ("127.0.0.1", "::1", "localhost"):
        logger.warning("Listening on %s without an API key: anyone who can reach it can use it.", host)
    scheme = "https" if config.frontend.ssl_certfile else "http"
    logger.info("Serving %r on " + scheme + "://%s:%d/v1", engine.model_config.served_model_name, host, port)
    freeze_startup_heap("Server")
    with _signals_end_quietly():
        server.run(sockets=[sock])
    return 0


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """uvicorn handles SIGTERM/SIGINT itself, then re-raises them against the handlers it found;
    with these no-op handlers in place, a graceful shutdown ends in exit status 0."""
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m folio.entrypoints.openai.api_server",
        description="An OpenAI-compatible HTTP server for one model.",
    )
    return make_arg_parser(parser)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return run_server(args)
    except ValueError as e:  # bad configuration: a clear message, no traceback
        print(f"folio serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
