"""Run the real server (uvicorn + the app + an AsyncLLM) on a loopback port inside the test process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import httpx
import uvicorn

from folio.engine.arg_utils import EngineArgs
from folio.engine.async_llm import AsyncLLM
from folio.entrypoints.openai.api_server import build_app
from folio.entrypoints.openai.cli_args import ServerConfig

# Only a bound on how long a broken server may hang a test, never an expectation of speed.
HANG_LIMIT_S = 120.0


def api_error(response: httpx.Response, status: int) -> dict:
    """The error of an answer in OpenAI's shape, checked: {"error": {message, type, param, code}}."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = HANG_LIMIT_S) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


class ServerThread:
    """uvicorn serving build_app(engine) on 127.0.0.1:<a free port>, in a background thread."""

    def __init__(self, engine: AsyncLLM, config: ServerConfig | None = None) -> None:
        self.engine = engine
        self.app = build_app(engine, config)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))  # the OS picks the port: no clashes between runs
        self.port = self._sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        wait_for(lambda: self.server.started or not self._thread.is_alive(), "the server to start")
        if not self.server.started:
            raise RuntimeError("the server failed to start")
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.should_exit = True
        self._thread.join(HANG_LIMIT_S)


class HeldEngine:
    """Stop the engine thread at the start of step() while held, so queue states are exact.

    Held from the start, or from `hold()` on; `release` (an Event) lets it step again.
    """

    def __init__(self, engine, held: bool = True) -> None:
        self.engine, self.entered, self.release = engine, threading.Event(), threading.Event()
        self._step = engine.step
        if not held:
            self.release.set()

    def hold(self) -> None:
        self.entered.clear()
        self.release.clear()

    def step(self):
        self.entered.set()
        self.release.wait()
        return self._step()

    def __enter__(self):
        self.engine.step = self.step
        return self

    def __exit__(self, *exc_info):
        self.release.set()
        del self.engine.step  # back to the class's method


def make_engine(model: str, max_model_len: int = 256, **kwargs) -> AsyncLLM:
    engine_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in EngineArgs.field_names()}
    args = EngineArgs(model=model, dtype="float32", device="cpu", max_model_len=max_model_len, seed=0, **engine_kwargs)
    return AsyncLLM.from_engine_args(args, **kwargs)
