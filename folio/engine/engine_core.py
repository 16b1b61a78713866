"""Where AsyncLLM's engine runs: on a thread of the server process, or in a process of its own.

Both give AsyncLLM the same four things: the model's config, tokenizer and sampling defaults,
`start(deliver)` (deliver is called, from some other thread, with each message of the
EngineLoop), `send(command)`, and `join()` once a StopCommand was sent.

EngineThread (the default) shares the server's GIL: the event loop's HTTP work and the engine's
Python take turns. EngineProcess gives the engine a GIL of its own, and a crash of its own (the
server then answers 503 instead of dying); commands and outputs cross a pipe, outputs as plain
tuples without their prompt, which the frontend already has (engine/wire.py). docs/serving.md
measures both.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from folio.config import ModelConfig
from folio.config.scheduler import SchedulerConfig
from folio.engine.engine_loop import (
    AbortCommand,
    Accepted,
    AddCommand,
    Died,
    EngineLoop,
    StopCommand,
    Stepped,
    Stopped,
)
from folio.engine.startup_heap import freeze_startup_heap
from folio.engine.warm_up import warm_up
from folio.engine.wire import WireDecoder, WireEncoder
from folio.logger import init_logger
from folio.sampling_params import SamplingParams

if TYPE_CHECKING:  # light at import: the engine process starts before the server imports torch
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.llm_engine import EngineStats, LLMEngine

logger = init_logger(__name__)

Deliver = Callable[[Any], None]


class EngineThread:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        warm_up(engine)  # on a GPU: the first clients do not pay the first steps' one-time costs
        engine.isolate_request_errors()
        self.model_config: ModelConfig = engine.config.model
        self.tokenizer = engine.get_tokenizer()
        self.default_params: SamplingParams = engine.default_sampling_params()
        self.initial_stats: EngineStats = engine.stats()
        self.scheduler_config: SchedulerConfig = engine.config.scheduler
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, deliver: Deliver) -> None:
        loop = EngineLoop(self.engine, self._take, deliver)
        self._thread = threading.Thread(target=loop.run, name="folio-engine", daemon=True)
        self._thread.start()

    def send(self, command: Any) -> None:
        self._commands.put(command)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _take(self, block: bool) -> list[Any]:
        return _drain(self._commands, block)


def _drain(commands: queue.SimpleQueue, block: bool) -> list[Any]:
    taken = [commands.get()] if block else []
    while True:
        try:
            taken.append(commands.get_nowait())
        except queue.Empty:
            return taken


# ---- a process of its own ---------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    model_config: ModelConfig
    has_tokenizer: bool
    default_params: SamplingParams
    stats: EngineStats
    scheduler_config: SchedulerConfig  # its step limits (AsyncLLM.embed cuts its chunks by them)


def build_engine(args: EngineArgs) -> LLMEngine:
    """The child's engine (a module-level function: spawn pickles it by name)."""
    from folio.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(args)


class EngineProcess:
    """The engine in a spawned child process (torch refuses CUDA in a child forked after the
    parent looked for a GPU, so no fork).

    The child starts at construction and is waited for by wait_ready(): `folio serve` starts it
    before importing the server, so both processes import torch and transformers at once.
    """

    def __init__(self, make_engine: Callable[[], LLMEngine]) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self.process = context.Process(target=run_engine_process, args=(make_engine, child_conn),
                                       name="folio-engine", daemon=True)
        self.process.start()
        logger.info("Started the engine process (pid %d).", self.process.pid)
        child_conn.close()
        self.engine = None  # it lives in the other process
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        # Outputs come back without their prompts: the decoder keeps them by request id.
        self._wire = WireDecoder()
        self._threads: list[threading.Thread] = []
        self._ready: Ready | None = None

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> EngineProcess:
        return cls(functools.partial(build_engine, args))

    def close(self) -> None:
        """Stop a child that will not be used (the server failed to start around it)."""
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: the child leaves SIGTERM to its parent (run_engine_process)
        self.process.join()

    def wait_ready(self) -> EngineProcess:
        """Block until the child's engine is built (ValueError if it failed to start)."""
        if self._ready is None:
            from folio.transformers_utils.tokenizer import get_tokenizer

            ready = self._receive_ready()
            self.model_config: ModelConfig = ready.model_config
            self.tokenizer = get_tokenizer(ready.model_config.tokenizer) if ready.has_tokenizer else None
            self.default_params: SamplingParams = ready.default_params
            self.initial_stats: EngineStats = ready.stats
            self.scheduler_config: SchedulerConfig = ready.scheduler_config
            self._ready = ready
        return self

    def _receive_ready(self) -> Ready:
        try:
            ready = self._conn.recv()
        except EOFError:
            self.process.join()
            raise RuntimeError(f"The engine process exited while starting (exit code {self.process.exitcode}).") from None
        if isinstance(ready, Died):
            self.process.join()
            raise ValueError(ready.message)
        return ready

    def start(self, deliver: Deliver) -> None:
        for target, name in ((self._write, "folio-engine-writer"), (self._read, "folio-engine-reader")):
            thread = threading.Thread(target=target, args=(deliver,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def send(self, command: Any) -> None:
        if isinstance(command, AddCommand):
            command = self._with_token_ids(command)
            prompt = command.prompt
            self._wire.add(command.request_id, prompt.get("prompt"), list(prompt.get("prompt_token_ids", [])))
        elif isinstance(command, AbortCommand):
            self._wire.forget(command.request_id)
        self._outbox.put(command)

    def _with_token_ids(self, command: AddCommand) -> AddCommand:
        """Text prompts are tokenized here, as the engine would, so the ids are known this side."""
        prompt = command.prompt
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        if "prompt_token_ids" in prompt or self.tokenizer is None or not isinstance(prompt.get("prompt"), str):
            return replace(command, prompt=prompt) if prompt is not command.prompt else command
        return replace(command, prompt={**prompt, "prompt_token_ids": list(self.tokenizer.encode(prompt["prompt"]))})

    def join(self) -> None:
        for thread in self._threads:
            thread.join()
        self.process.join(timeout=30)
        if self.process.is_alive():
            logger.warning("The engine process did not stop; killing it.")
            self.process.kill()
            self.process.join()

    # A writer thread, so that a full pipe (the engine busy in a step) never blocks the event loop.
    def _write(self, deliver: Deliver) -> None:
        while True:
            command = self._outbox.get()
            try:
                self._conn.send(command)
            except OSError:
                return  # the process is gone: the reader reports it
            if isinstance(command, StopCommand):
                return

    def _read(self, deliver: Deliver) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self.process.join(timeout=5)
                deliver(Died(f"The engine process exited (exit code {self.process.exitcode}); restart the server."))
                return
            if isinstance(message, Stepped):
                try:
                    decode = self._wire.decode
                    message = replace(message, outputs=[decode(o) for o in message.outputs])
                    for request_id in message.failed:
                        self._wire.failed(request_id)
                except Exception as e:  # a reader that died silently would leave every request waiting
                    logger.exception("Could not decode the engine process's step.")
                    deliver(Died(f"The server could not read the engine's output ({type(e).__name__}: {e}); "
                                 "restart the server."))
                    return
            elif isinstance(message, Accepted):
                self._wire.accepted([request_id for request_id, _, _ in message.results])
            deliver(message)
            if isinstance(message, (Stopped, Died)):
                return


def run_engine_process(make_engine: Callable[[], LLMEngine], conn: Any) -> None:
    """The child's main: build the engine, say Ready, run the loop until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    signal.signal(signal.SIGTERM, _on_sigterm)
    _die_with_parent()
    try:
        engine = make_engine()
        warm_up(engine)  # before Ready: the first clients do not pay the first steps' one-time costs
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        conn.send(Died(f"The engine failed to start: {e}"))
        return
    engine.isolate_request_errors()
    engine.output_processor.wire_records = True  # streamed steps as wire records, not RequestOutputs
    freeze_startup_heap("Engine process")
    conn.send(Ready(engine.config.model, engine.get_tokenizer() is not None,
                    engine.default_sampling_params(), engine.stats(), engine.config.scheduler))
    EngineLoop(engine, _pipe_take(conn), _pipe_emit(conn)).run()


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM in the engine process. Sent to the whole group (systemd stops a service that way,
    as does `timeout`), it reaches the server too, which lets in-flight requests finish and then
    stops this process in order: dying at once would fail them and log a crash. So while the
    server lives this signal is left to it (stop the server, or SIGKILL this process); once the
    server is gone (the parent-death signal below is also SIGTERM) the process exits."""
    parent = multiprocessing.parent_process()
    if parent is None or not parent.is_alive():
        os._exit(0)  # as SIGTERM's default action would: nothing is left to hand results to
    logger.info("Engine process: SIGTERM received; the server stops the engine when it shuts down.")


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the server process dies, however it dies (a killed
    parent runs no cleanup, and an orphaned engine would keep its GPU memory)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the pipe's EOF stops the loop instead
        return
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():  # it died before prctl took effect
        raise SystemExit(0)


def _pipe_take(conn: Any) -> Callable[[bool], list[Any]]:
    def take(block: bool) -> list[Any]:
        commands = []
        try:
            if block:
                commands.append(conn.recv())
            while conn.poll():
                commands.append(conn.recv())
        except (EOFError, OSError):  # the server is gone: stop
            commands.append(StopCommand())
        return commands

    return take


def _pipe_emit(conn: Any) -> Callable[[Any], None]:
    encode = WireEncoder().encode

    def emit(message: Any) -> None:
        if isinstance(message, Stepped):
            message = replace(message, outputs=encode(message.outputs))
        try:
            conn.send(message)
        except OSError:
            pass  # the server is gone; the next take() stops the loop

    return emit
