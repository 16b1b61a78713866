"""AsyncLLM: the LLMEngine behind an asyncio front, for the server.

The engine runs on its own thread and steps the whole batch back to back; HTTP handlers on the
event loop never call into it directly. The two sides meet in two places only:

- commands (add, abort, stop) go to the engine thread through a thread-safe queue, which it
  drains between steps (blocking on it only while it has nothing to do);
- after taking commands, one `loop.call_soon_threadsafe` answers the adds (accepted, or the
  error); after each step, one more hands the event loop every RequestOutput of the step and
  the engine's stats.

So an HTTP handler waits at most one step for its request to be accepted, and a slow client
never holds the engine: its outputs pile up in its RequestStream and are merged into one
when it next reads (DELTA outputs concatenate). Torch releases the GIL inside its kernels, and
the engine thread holds it for the Python around them; docs/serving.md measures how much
stepping speed the HTTP side takes.

Failure: an exception raised while adding one request, or while processing its output in a step
(the engine isolates those, see LLMEngine.isolate_request_errors), fails that request only: its
caller gets the error and the engine goes on. Any other exception from `step()` leaves the
engine's state unknown: the engine is declared dead, every in-flight request fails with
EngineDeadError, and new ones are refused.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from folio.engine.arg_utils import EngineArgs
from folio.engine.input_processor import PromptType
from folio.engine.llm_engine import EngineStats, LLMEngine
from folio.engine.metrics import EngineMetrics
from folio.logger import init_logger
from folio.outputs import CompletionOutput, RequestOutput
from folio.sampling_params import SamplingParams

logger = init_logger(__name__)


class EngineDeadError(RuntimeError):
    """The engine stopped (after an error, or for shutdown): no request can be served."""


class RequestFailedError(RuntimeError):
    """Processing this request's output raised; the request was dropped, the engine goes on."""


class QueueFullError(RuntimeError):
    """Too many sequences are waiting to be scheduled; the caller should retry later."""


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    priority: int
    future: asyncio.Future


@dataclass(frozen=True)
class _Abort:
    request_id: str


_STOP = object()


class AsyncLLM:
    """Serve many requests at once from one LLMEngine stepping on a dedicated thread.

        llm = AsyncLLM.from_engine_args(EngineArgs(model=path))
        llm.start()                                   # inside the running event loop
        async for output in llm.generate("Hello", SamplingParams(...), "req-1"): ...
    """

    def __init__(
        self,
        engine: LLMEngine,
        *,
        max_waiting_requests: int | None = None,
        metrics: EngineMetrics | None = None,
    ) -> None:
        if max_waiting_requests is not None and max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be at least 1 (or None), got {max_waiting_requests}.")
        self.engine = engine
        engine.isolate_request_errors()
        self.max_waiting_requests = max_waiting_requests
        self.metrics = metrics or EngineMetrics(engine.config.model.served_model_name)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Event-loop side only: touched by handlers and by _deliver, never by the engine thread.
        self._streams: dict[str, RequestStream] = {}
        self._pending: dict[str, asyncio.Future] = {}  # adds sent, not yet answered
        self._pending_sequences = 0
        self._stats = engine.stats()
        self._dead: EngineDeadError | None = None
        # Engine-thread side only.
        self._live: set[str] = set()  # accepted and not finished

    @classmethod
    def from_engine_args(cls, args: EngineArgs, **kwargs: Any) -> AsyncLLM:
        return cls(LLMEngine.from_engine_args(args), **kwargs)

    # ---- what handlers read -----------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    @property
    def model_config(self):
        return self.engine.config.model

    def default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def stats(self) -> EngineStats:
        """The engine's stats as of its last step (or last command, when idle)."""
        return self._stats

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._dead is None

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will consume the outputs."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLM is already started.")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="folio-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, reason: str = "The server is shutting down.") -> None:
        """Fail what is still in flight, abort it in the engine, and stop the engine thread."""
        if self._thread is None:
            return
        if self._dead is None:
            self._dead = EngineDeadError(reason)
        self._fail_all(EngineDeadError(reason))
        self._commands.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    # ---- requests -------------------------------------------------------------------------
    async def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0
    ) -> RequestStream:
        """Queue a request; returns its stream once the engine accepted it.

        Raises what LLMEngine.add_request raises for an invalid request (ValueError, with
        `.param` for a SamplingParamsError), QueueFullError, or EngineDeadError.
        """
        self._check_accepting(request_id)
        stream = RequestStream(request_id, self._abort)
        future = self._loop.create_future()
        self._streams[request_id] = stream
        self._pending[request_id] = future
        self._pending_sequences += params.n
        self._commands.put(_Add(request_id, prompt, params, priority, future))
        try:
            await future
        except BaseException:
            self._streams.pop(request_id, None)
            stream.finished = True
            self._commands.put(_Abort(request_id))  # harmless if it was never added
            raise
        return stream

    async def generate(
        self, prompt: PromptType, params: SamplingParams, request_id: str, priority: int = 0
    ) -> AsyncIterator[RequestOutput]:
        """add_request, then the request's outputs; leaving early aborts the request."""
        stream = await self.add_request(request_id, prompt, params, priority)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.abort()

    def _check_accepting(self, request_id: str) -> None:
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        if self._thread is None:
            raise RuntimeError("AsyncLLM.start() was not called.")
        if request_id in self._streams:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        waiting = self._stats.num_waiting + self._pending_sequences
        if self.max_waiting_requests is not None and waiting >= self.max_waiting_requests:
            raise QueueFullError(
                f"{waiting} sequences are waiting to be scheduled (the limit is "
                f"{self.max_waiting_requests}); retry later."
            )

    def _abort(self, request_id: str) -> None:
        """Called by a RequestStream that is abandoned before it finished."""
        self._streams.pop(request_id, None)
        self._commands.put(_Abort(request_id))

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                commands = self._take_commands(block=not busy)
                if _STOP in commands:
                    self._abort_live()
                    return
                added = self._apply(commands)
                if added:  # answer the adds now: their callers need not wait for the step
                    self._post(self._accept, added, self.engine.stats())
                outputs: list[RequestOutput] = []
                failed: dict[str, Exception] = {}
                if self.engine.has_unfinished_requests():
                    start = time.perf_counter()
                    outputs = self.engine.step()
                    self.metrics.record_step(outputs, time.perf_counter() - start)
                    self._live.difference_update(o.request_id for o in outputs if o.finished)
                    failed = self._take_failed()
                stats = self.engine.stats()
                self.metrics.record_stats(stats)
                self._post(self._deliver, outputs, failed, stats)
        except BaseException as e:  # noqa: BLE001 - whatever it was, clients must hear of it
            logger.exception("The engine thread failed; failing every request in flight.")
            self._post(self._on_engine_dead, e)

    def _take_failed(self) -> dict[str, Exception]:
        failed = self.engine.take_request_errors()
        for request_id, error in failed.items():
            logger.error("Request %s failed and was dropped: %r", request_id, error, exc_info=error)
            self._live.discard(request_id)
            self.metrics.record_abort(request_id)
        return failed

    def _take_commands(self, block: bool) -> list[Any]:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, commands: list[Any]) -> list[tuple[_Add, BaseException | None]]:
        added = []
        for command in commands:
            if isinstance(command, _Abort):
                if command.request_id in self._live:
                    self._live.discard(command.request_id)
                    self.engine.abort_request(command.request_id)
                    self.metrics.record_abort(command.request_id)
                continue
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params,
                                        priority=command.priority)
            except Exception as e:  # an invalid request: its caller gets the error
                added.append((command, e))
                continue
            self._live.add(command.request_id)
            added.append((command, None))
        return added

    def _abort_live(self) -> None:
        if self._live:
            self.engine.abort_request(list(self._live))
            for request_id in self._live:
                self.metrics.record_abort(request_id)
            self._live.clear()
        self._post(self._set_stats, self.engine.stats())

    def _post(self, callback, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    # ---- back on the event loop -------------------------------------------------------------
    def _accept(self, added: list[tuple[_Add, BaseException | None]], stats: EngineStats) -> None:
        self._stats = stats
        for command, error in added:
            self._pending.pop(command.request_id, None)
            self._pending_sequences -= command.params.n
            if command.future.done():
                continue  # its caller gave up (it also sent the abort)
            if error is None:
                command.future.set_result(None)
            else:
                command.future.set_exception(error)

    def _deliver(self, outputs: list[RequestOutput], failed: dict[str, Exception], stats: EngineStats) -> None:
        self._stats = stats
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # abandoned: its abort is on the way
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]
        for request_id, error in failed.items():
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(RequestFailedError(f"Request {request_id} failed: {error!r}"))

    def _set_stats(self, stats: EngineStats) -> None:
        self._stats = stats

    def _on_engine_dead(self, error: BaseException) -> None:
        self._dead = _dead_error(error)
        self._fail_all(self._dead)

    def _fail_all(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        self._pending_sequences = 0
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()


def _dead_error(cause: BaseException) -> EngineDeadError:
    return EngineDeadError(f"The engine stopped after an error ({cause!r}); restart the server.")


class RequestStream:
    """One request's outputs, in order. Iterate it; outputs that queued up arrive merged.

    Lives on the event loop. `abort()` (or leaving an `async with` early) tells the engine to
    drop the request and free its KV blocks.
    """

    def __init__(self, request_id: str, on_abort) -> None:
        self.request_id = request_id
        self.finished = False
        self._items: deque[RequestOutput | BaseException] = deque()
        self._ready = asyncio.Event()
        self._on_abort = on_abort

    def put(self, item: RequestOutput | BaseException) -> None:
        self._items.append(item)
        self._ready.set()

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._on_abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.abort()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished and not self._items:
            raise StopAsyncIteration
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        items = list(self._items)
        self._items.clear()
        for item in items:
            if isinstance(item, BaseException):
                self.finished = True
                raise item
        output = merge_outputs(items)
        if output.finished:
            self.finished = True
        return output


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """Fold consecutive DELTA outputs of one request into one (FINAL_ONLY has only one)."""
    if len(outputs) == 1:
        return outputs[0]
    by_index: dict[int, CompletionOutput] = {}
    for output in outputs:
        for c in output.outputs:
            seen = by_index.get(c.index)
            by_index[c.index] = c if seen is None else _concat(seen, c)
    last = outputs[-1]
    return replace(
        last,
        outputs=[by_index[i] for i in sorted(by_index)],
        num_cached_tokens=max(o.num_cached_tokens for o in outputs),
    )


def _concat(a: CompletionOutput, b: CompletionOutput) -> CompletionOutput:
    logprobs = None
    if a.logprobs is not None or b.logprobs is not None:
        logprobs = (a.logprobs or []) + (b.logprobs or [])
    return CompletionOutput(
        index=a.index,
        text=a.text + b.text,
        token_ids=a.token_ids + b.token_ids,
        cumulative_logprob=b.cumulative_logprob,
        logprobs=logprobs,
        finish_reason=b.finish_reason,
        stop_reason=b.stop_reason,
    )
