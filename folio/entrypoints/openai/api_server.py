"""The OpenAI-compatible server: `folio serve` or `python -m folio.entrypoints.openai.api_server`.

build_app() assembles the FastAPI app around an AsyncLLM (tests call it directly); run_server()
loads the engine, binds the socket and runs uvicorn. On SIGTERM (or Ctrl-C) uvicorn stops
accepting, in-flight requests get --shutdown-timeout seconds to finish, what is left is
aborted (a stream ends with finish_reason "abort" and [DONE], a whole response is a 503), the
engine stops, and the process exits 0.

The server's flags are checked before the engine is built (check_server_args; folio serve checks
them before it starts the engine's process), so a mistyped flag fails at once, not after the
model loaded. Whatever fails once the engine exists (the app, an adapter of --lora-modules) stops
the engine too (an engine process would otherwise keep the server's exit waiting forever); a bad
flag is one error line, no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from folio.engine.arg_utils import EngineArgs
from folio.engine.async_llm import AsyncLLM
from folio.engine.engine_core import EngineProcess
from folio.engine.engine_loop import StopCommand
from folio.entrypoints.openai.auth import APIKeyMiddleware
from folio.entrypoints.openai.dashboard import install_dashboard
from folio.entrypoints.openai.cli_args import (
    ServerConfig,
    bind_socket,
    check_lora_flags,
    check_server_args,
    engine_process_wanted,
    make_arg_parser,
)
from folio.entrypoints.openai.compat_routes import add_cors, include_compat_routes, log_requests
from folio.entrypoints.openai.errors import install_error_handlers
from folio.entrypoints.openai.frontend_args import tls_error
from folio.entrypoints.openai.protocol.unsupported import IgnoredFieldsLog
from folio.entrypoints.openai.router import ServingState, refuse_lone_surrogates, router
from folio.entrypoints.openai.serving_chat import OpenAIServingChat
from folio.entrypoints.openai.serving_completion import OpenAIServingCompletion
from folio.entrypoints.openai.serving_models import OpenAIServingModels
from folio.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from folio.entrypoints.openai.streaming import LiveStreams
from folio.engine.startup_heap import freeze_startup_heap
from folio.logger import init_logger
from folio.transformers_utils.chat_template import resolve_chat_template
from folio.version import __version__

logger = init_logger("folio.entrypoints.openai.api_server")  # also when run as __main__
STOP_WAIT_S = 10.0  # how long an engine process that never served gets to stop before it is killed


def build_app(engine: AsyncLLM, config: ServerConfig | None = None, *, start_engine: bool = True) -> FastAPI:
    """The app for one engine. start_engine: its lifespan starts the engine, loads --lora-modules
    and stops the engine; run_server does that itself (FolioServer), outside uvicorn's lifespan,
    whose failures are tracebacks and "Application startup failed"."""
    config = config or ServerConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not start_engine:
            yield
            return
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
    app.state.live_streams = LiveStreams()  # what a shutdown out of time ends (FolioServer)
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
    check_lora_flags(config, engine.lora_enabled)
    models = OpenAIServingModels(name, model.model, model.max_model_len, lora_enabled=engine.lora_enabled)
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


def run_server(args: argparse.Namespace, core: EngineProcess | None = None, *,
               config: ServerConfig | None = None, sock: socket.socket | None = None) -> int:
    """Serve until SIGTERM/SIGINT. `core`: an engine process already started (folio serve starts
    it before importing this module); without one, --engine-process decides (unset: a process on
    a GPU, a thread on the CPU). `config` and `sock`: the flags already checked
    (check_server_args) and the socket already bound, by a caller that did so before it started
    `core`. Every failure stops the engine; a bad flag is a ValueError."""
    engine: AsyncLLM | None = None
    given = core is not None  # and ready: folio serve waited for it
    try:
        if config is None:
            config = check_server_args(args)
        if sock is None:
            sock = bind_socket(config.host, config.port)
        with _closed_on_error(sock):
            engine_args = EngineArgs.from_cli_args(args)
            if core is None and engine_process_wanted(config.engine_process, engine_args.device,
                                                      engine_args.tensor_parallel_size):
                core = EngineProcess.from_engine_args(engine_args)
            engine = _make_engine(config, engine_args, core)
            server = FolioServer(build_app(engine, config, start_engine=False), config, engine)
    except BaseException:
        _stop_unstarted(engine, core, ready=given or engine is not None)
        raise
    freeze_startup_heap("Server")
    server.run(sockets=[sock])  # FolioServer.serve starts the engine and always stops it
    return 0


def _make_engine(config: ServerConfig, engine_args: EngineArgs, core: EngineProcess | None) -> AsyncLLM:
    if core is not None:
        return AsyncLLM(core=core, max_waiting_requests=config.max_waiting_requests)
    return AsyncLLM.from_engine_args(engine_args, max_waiting_requests=config.max_waiting_requests)


@contextlib.contextmanager
def _closed_on_error(sock: socket.socket) -> Iterator[None]:
    try:
        yield
    except BaseException:
        sock.close()
        raise


def _stop_unstarted(engine: AsyncLLM | None, core: EngineProcess | None, ready: bool) -> None:
    """Stop an engine that never started serving: its process, or its tensor-parallel workers.

    A ready engine process is asked to stop: a killed one leaves what it registered with
    multiprocessing's resource tracker, which then warns of a leak under the error line. One
    still loading its model would not read the request for a while: it is killed."""
    if core is not None and ready and core.process.is_alive():
        core.start(lambda message: None)  # the pipe's writer and reader threads; nobody awaits the answer
        core.send(StopCommand())
        core.process.join(timeout=STOP_WAIT_S)
    if core is not None:
        core.close()  # kills it if it is still there
    elif engine is not None and engine.engine is not None:
        engine.engine.shutdown()


def _log_serving(config: ServerConfig, engine: AsyncLLM, sockets: list[socket.socket]) -> None:
    host, port = sockets[0].getsockname()[:2]
    if not config.api_key and host not in ("127.0.0.1", "::1", "localhost"):
        logger.warning("Listening on %s without an API key: anyone who can reach it can use it.", host)
    scheme = "https" if config.frontend.ssl_certfile else "http"
    logger.info("Serving %r on " + scheme + "://%s:%d/v1", engine.model_config.served_model_name, host, port)


class FolioServer(uvicorn.Server):
    """uvicorn around an engine it starts and stops itself.

    The engine starts and --lora-modules load before uvicorn listens, so a bad adapter is one
    error line. At --shutdown-timeout after SIGTERM, what is still in flight is ended in order
    (drain); uvicorn's own deadline, SHUTDOWN_BACKSTOP_S later, only cancels what then still
    hangs (a client that stopped reading), which it logs as a crash.
    """

    SHUTDOWN_BACKSTOP_S = 2.0

    def __init__(self, app: FastAPI, config: ServerConfig, engine: AsyncLLM) -> None:
        super().__init__(_uvicorn_config(app, config, self.SHUTDOWN_BACKSTOP_S))
        self.folio_app, self.folio_config, self.engine = app, config, engine
        self._engine_stopped: asyncio.Future | None = None
        self._drain_task: asyncio.Task | None = None  # held: the loop keeps only weak references
        try:  # TLS files are read here too (check_server_args read them first), before serving
            self.config.load()
        except (ssl.SSLError, OSError) as e:
            raise tls_error(e) from None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.start()
        try:
            await self.folio_app.state.serving.models.load_static(self.engine, self.folio_config.lora_modules)
            _log_serving(self.folio_config, self.engine, sockets or [])
            with _signals_end_quietly():
                await super().serve(sockets)
        finally:
            await self._stop_engine()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.folio_config.shutdown_timeout, self._start_drain)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        """Streams end with finish_reason "abort" and [DONE]; stopping the engine then fails the
        rest (whole responses, requests not yet accepted) with a 503 "shutting down"."""
        try:
            ended = self.folio_app.state.live_streams.end_all()
            logger.info("--shutdown-timeout reached: aborting what is still in flight (%d stream(s)).", ended)
        finally:
            await self._stop_engine()

    async def _stop_engine(self) -> None:
        if self._engine_stopped is None:
            self._engine_stopped = asyncio.ensure_future(self.engine.shutdown())
        await self._engine_stopped


def _uvicorn_config(app: FastAPI, config: ServerConfig, backstop_s: float) -> uvicorn.Config:
    frontend = config.frontend
    return uvicorn.Config(
        app,
        log_level=config.log_level,
        access_log=config.access_log,
        timeout_graceful_shutdown=config.shutdown_timeout + backstop_s,
        lifespan="on",
        root_path=frontend.root_path,
        ssl_keyfile=frontend.ssl_keyfile,
        ssl_certfile=frontend.ssl_certfile,
        ssl_ca_certs=frontend.ssl_ca_certs,
        ssl_cert_reqs=frontend.ssl_cert_reqs,
    )


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
    except ValueError as e:  # bad configuration: a clear message, no traceback (the engine is stopped)
        print(f"folio serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
