"""AsyncLLM: the LLMEngine behind an asyncio front, for the server.

The engine steps the whole batch back to back in an EngineLoop, on a thread of its own
(EngineThread) or in a process of its own (EngineProcess, see engine_core.py); HTTP handlers on
the event loop never call into it. The two sides meet in two places only:

- commands (add, abort, stop) go to the loop, which drains them between steps (blocking only
  while it has nothing to do);
- the loop's messages come back through one `loop.call_soon_threadsafe` each: the answers to
  the adds it just applied (Accepted), then after each step every RequestOutput of the step,
  the requests whose processing failed, and the engine's stats (Stepped).

So an HTTP handler waits at most one step for its request to be accepted, and a slow client never
holds the engine: its outputs pile up in its RequestStream (engine/request_stream.py), merged into
one when it next reads (DELTA outputs concatenate). Metrics are recorded here, from the messages.

Failure: an invalid request (or one whose output processing raised) fails alone; if the loop
dies (an exception from step(), or the engine process exits), every request in flight fails
with EngineDeadError and new ones are refused; /health then answers 503.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from folio.engine.arg_utils import EngineArgs
from folio.engine.embed_chunks import embed_chunks
from folio.engine.engine_core import EngineProcess, EngineThread
from folio.engine.engine_loop import (
    AbortCommand,
    Accepted,
    AddCommand,
    LoRACommand,
    Died,
    EmbedCommand,
    Embedded,
    StateAnswer,
    StopCommand,
    Stepped,
    Stopped,
)
from folio.engine.input_processor import PromptType
from folio.engine.llm_engine import EngineStats, LLMEngine
from folio.engine.metrics import EngineMetrics
from folio.engine.request_stream import RequestStream, merge_outputs  # noqa: F401  (merge_outputs: re-exported)
from folio.engine.state_history import StateHistory
from folio.engine.state_reads import StateReads
from folio.logger import init_logger
from folio.lora.request import LoRARequest
from folio.outputs import RequestOutput
from folio.param_checks import SamplingParamsError
from folio.sampling_params import RequestOutputKind, SamplingParams

logger = init_logger(__name__)


class EngineDeadError(RuntimeError):
    """The engine stopped (after an error, or for shutdown): no request can be served."""


class RequestFailedError(RuntimeError):
    """Processing this request's output raised; the request was dropped, the engine goes on."""


class QueueFullError(RuntimeError):
    """Too many sequences are waiting to be scheduled; the caller should retry later."""


class AsyncLLM:
    """Serve many requests at once from one LLMEngine stepping on its own thread or process.

        llm = AsyncLLM.from_engine_args(EngineArgs(model=path), engine_process=True)
        llm.start()                                   # inside the running event loop
        async for output in llm.generate("Hello", SamplingParams(...), "req-1"): ...
    """

    def __init__(self, engine: LLMEngine | None = None, *, core: EngineThread | EngineProcess | None = None,
                 max_waiting_requests: int | None = None, metrics: EngineMetrics | None = None) -> None:
        if (engine is None) == (core is None):
            raise ValueError("Pass an engine (it runs on a thread) or a core, not both.")
        if max_waiting_requests is not None and max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be at least 1 (or None), got {max_waiting_requests}.")
        if isinstance(core, EngineProcess):
            core.wait_ready()
        self.core = core if core is not None else EngineThread(engine)
        self.engine = self.core.engine  # the LLMEngine when it runs on a thread here, else None
        self.max_waiting_requests = max_waiting_requests
        self.metrics = metrics or EngineMetrics(self.core.model_config.served_model_name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        # Event-loop side only: touched by handlers and by _on_message, never by other threads.
        self._streams: dict[str, RequestStream] = {}
        self._pending: dict[str, asyncio.Future] = {}  # adds sent, not yet answered
        self._pending_sequences = 0
        self._embeds: dict[str, asyncio.Future] = {}  # embed chunks sent, not yet answered
        self._embedding: set[str] = set()  # the ids of the embed calls in progress
        sched = self.core.scheduler_config  # the engine's step limits (an engine process's from Ready)
        self._embed_chunk_limits = (sched.max_num_batched_tokens, sched.max_num_seqs)
        self._stats = self.core.initial_stats
        self._dead: EngineDeadError | None = None
        self._state_reads = StateReads(self.core.send)
        self.history: StateHistory | None = None  # per-second series, once the dashboard asks

    @classmethod
    def from_engine_args(cls, args: EngineArgs, *, engine_process: bool = False, **kwargs: Any) -> AsyncLLM:
        if engine_process:
            return cls(core=EngineProcess.from_engine_args(args), **kwargs)
        return cls(LLMEngine.from_engine_args(args), **kwargs)

    # ---- what handlers read -----------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.core.tokenizer

    @property
    def model_config(self):
        return self.core.model_config

    @property
    def lora_enabled(self) -> bool:
        """Whether the engine serves LoRA adapters (started with enable_lora)."""
        return self.core.initial_stats.max_loras > 0

    def default_sampling_params(self) -> SamplingParams:
        return self.core.default_params.clone()

    def stats(self) -> EngineStats:
        """The engine's stats as of its last step (or last command, when idle)."""
        return self._stats

    @property
    def is_running(self) -> bool:
        return self._started and self._dead is None

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def enable_state_history(self) -> None:
        """Record throughput, TTFT and ITL per second from now on (engine/state_history.py)."""
        if self.history is None:
            self.history = StateHistory(self._stats.num_computed_tokens)

    async def engine_state(self, with_blocks: bool = False) -> dict[str, Any]:
        """The engine's queues and KV cache, read between two steps (core/engine_state.py),
        with the per-second series when the history is on (docs/dashboard.md)."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        if not self._started:
            raise RuntimeError("AsyncLLM.start() was not called.")
        state = await self._state_reads.read(with_blocks)
        state["series"] = self.history.series() if self.history is not None else None
        return state

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine loop; call from the event loop that will consume the outputs."""
        if self._started:
            raise RuntimeError("AsyncLLM is already started.")
        self._loop = asyncio.get_running_loop()
        self._started = True
        self.core.start(self._post)

    async def shutdown(self, reason: str = "The server is shutting down.") -> None:
        """Fail what is still in flight, abort it in the engine, and stop the engine loop."""
        if not self._started:
            return
        if self._dead is None:
            self._dead = EngineDeadError(reason)
        self._fail_all(EngineDeadError(reason))
        self.core.send(StopCommand())
        await asyncio.to_thread(self.core.join)

    # ---- requests -------------------------------------------------------------------------
    async def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
                          lora_request: LoRARequest | None = None) -> RequestStream:
        """Queue a request; returns its stream once the engine accepted it. Raises what
        LLMEngine.add_request raises for an invalid request (ValueError, with `.param` for a
        SamplingParamsError), QueueFullError, or EngineDeadError."""
        return (await self.add_requests([(request_id, prompt, params)], priority, lora_request))[0]

    async def add_requests(self, requests: list[tuple[str, PromptType, SamplingParams]], priority: int = 0,
                           lora_request: LoRARequest | None = None) -> list[RequestStream]:
        """Queue (request_id, prompt, params) requests all or none: their sequences together are
        checked once against the room left in the waiting queue (more than max_waiting_requests
        in all is a SamplingParamsError: never queued), then all are sent at once; if one is
        refused, or the caller is cancelled, all are withdrawn."""
        self._check_accepting([r[0] for r in requests], [params.n for _, _, params in requests])
        sent = []
        try:
            for request_id, prompt, params in requests:
                # (beam search's params have no output kind: its one output comes when it finishes)
                cumulative = getattr(params, "output_kind", None) == RequestOutputKind.CUMULATIVE
                stream, future = RequestStream(request_id, self._abort, cumulative=cumulative), self._loop.create_future()
                try:  # (an engine process tokenizes here: a send that raises leaves nothing behind)
                    self.core.send(AddCommand(request_id, prompt, params, priority, lora_request))
                except BaseException:
                    stream.finished = True
                    raise
                self._streams[request_id], self._pending[request_id] = stream, future
                sent.append((stream, future))
                self._pending_sequences += params.n
            await asyncio.wait([future for _, future in sent])  # every add answered
            errors = [future.exception() for _, future in sent if future.exception() is not None]
            if errors:
                raise errors[0]
        except BaseException:
            for stream, future in sent:
                if future.done() and not future.cancelled() and future.exception() is None:
                    stream.abort()  # accepted: an abort like any other
                else:  # refused, or not answered yet (its answer is dropped): harmless if never added
                    future.cancel()
                    self._streams.pop(stream.request_id, None)
                    stream.finished = True
                    self.core.send(AbortCommand(stream.request_id))
            raise
        return [stream for stream, _ in sent]

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load and check an adapter in the engine (ValueError if it cannot serve it)."""
        await self._lora_command(LoRACommand(f"lora-{uuid.uuid4().hex}", lora_request=lora_request))

    async def remove_lora(self, lora_int_id: int) -> None:
        """Unload an adapter (ValueError if unknown or still in use)."""
        await self._lora_command(LoRACommand(f"lora-{uuid.uuid4().hex}", remove_id=lora_int_id))

    async def _lora_command(self, command: LoRACommand) -> None:
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        future = self._loop.create_future()
        self._pending[command.command_id] = future
        self.core.send(command)
        await future

    async def generate(self, prompt: PromptType, params: SamplingParams, request_id: str, priority: int = 0,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """add_request, then the request's outputs; leaving early aborts the request."""
        stream = await self.add_request(request_id, prompt, params, priority, lora_request)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    async def embed(self, request_id: str, prompts: list[list[int]], pooler_config: Any) -> list[list[float]]:
        """Embeddings of token prompts, in order, computed by the engine between two steps
        (LLMEngine.embed) a chunk at a time (embed_chunks), each sent once the one before is
        answered: generation steps go on between chunks, and a cancelled caller (its client
        left) sends no further chunk. Raises ValueError for an invalid prompt, or EngineDeadError."""
        self._check_accepting([request_id], [])
        if request_id in self._embedding:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        self._embedding.add(request_id)
        vectors: list[list[float]] = []
        try:
            for chunk in self.embed_chunks(prompts):
                if self._dead is not None:
                    raise EngineDeadError(str(self._dead))
                command_id = f"{request_id}#{uuid.uuid4().hex}"  # a late answer is never taken for another's
                future = self._embeds[command_id] = self._loop.create_future()
                self.core.send(EmbedCommand(command_id, chunk, pooler_config))
                try:
                    vectors += await future
                finally:
                    self._embeds.pop(command_id, None)
        finally:
            self._embedding.discard(request_id)
        return vectors

    def embed_chunks(self, prompts: list[list[int]]) -> list[list[list[int]]]:
        """The chunks embed sends (folio/engine/embed_chunks.py), at this engine's step limits."""
        return embed_chunks(prompts, *self._embed_chunk_limits)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.abort()

    def _check_accepting(self, request_ids: list[str], ns: list[int]) -> None:
        """Requests of ns sequences each (none: an embedding) fit the waiting queue, all at once."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        if not self._started:
            raise RuntimeError("AsyncLLM.start() was not called.")
        used = next((request_id for request_id in request_ids if request_id in self._streams), None)
        if used is not None:
            raise ValueError(f"Request id {used!r} is already in use.")
        self.check_fits_queue(ns)  # never fits: a 400; no room now: a 503 (below)
        limit, num_sequences = self.max_waiting_requests, sum(ns)
        waiting = self._stats.num_waiting + self._pending_sequences
        if limit is not None and (waiting >= limit or waiting + num_sequences > limit):
            more = f", and this request asks for {num_sequences} more" if num_sequences else ""
            raise QueueFullError(f"{waiting} sequences are waiting to be scheduled{more} (the limit is "
                                 f"{limit}); retry later.")

    def check_fits_queue(self, ns: list[int]) -> None:
        """A 400 for a request whose sequences (ns per prompt) outnumber the waiting queue itself."""
        if (limit := self.max_waiting_requests) is not None and sum(ns) > limit:
            raise SamplingParamsError("n" if max(ns) > 1 else "prompt", f"This request asks for {sum(ns)} sequences "
                                      f"({len(ns)} prompt(s) x n={max(ns)}); at most {limit} may wait to be scheduled "
                                      "(max_waiting_requests): send fewer prompts or a smaller n.")

    def _abort(self, request_id: str) -> None:
        """Called by a RequestStream that is abandoned before it finished."""
        self._streams.pop(request_id, None)
        self.metrics.record_abort(request_id)
        if self.history is not None:
            self.history.forget(request_id)
        self.core.send(AbortCommand(request_id))

    # ---- messages from the engine (posted onto the event loop) --------------------------------
    def _post(self, message: Any) -> None:
        """Called on the engine's (or its reader's) thread."""
        try:
            self._loop.call_soon_threadsafe(self._on_message, message)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _on_message(self, message: Any) -> None:
        if isinstance(message, Stepped):
            self._on_step(message)
        elif isinstance(message, Accepted):
            self._on_accepted(message)
        elif isinstance(message, Embedded):
            future = self._embeds.get(message.request_id)
            if future is not None and not future.done():
                if message.error is None:
                    future.set_result(message.embeddings)
                else:
                    future.set_exception(message.error.to_exception())
        elif isinstance(message, StateAnswer):
            self._state_reads.answer(message)
        elif isinstance(message, Died):
            logger.error("%s", message.message)
            self._dead = EngineDeadError(message.message)
            self._fail_all(self._dead)
        elif isinstance(message, Stopped):
            self._stats = message.stats

    def _on_accepted(self, message: Accepted) -> None:
        self._stats = message.stats
        for request_id, n, error in message.results:
            future = self._pending.pop(request_id, None)
            self._pending_sequences -= n
            if future is None or future.done():
                continue  # its caller gave up (it also sent the abort)
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error.to_exception())

    def _on_step(self, message: Stepped) -> None:
        self._stats = message.stats
        self.metrics.record_stats(message.stats)
        # An output of a request aborted since the step (its caller gone) would recreate the
        # per-request tallies the abort removed, and nothing would remove them again. An output
        # under an id whose add is not yet accepted is an aborted namesake's: the engine answers
        # an add (Accepted) before any step that runs it, and a reused id must not get the old
        # request's tokens (or its end).
        pending = self._pending
        outputs = [o for o in message.outputs if o.request_id in self._streams and o.request_id not in pending]
        if outputs or message.seconds:
            self.metrics.record_step(outputs, message.seconds)
        if self.history is not None:
            self.history.record_step(outputs, message.stats.num_computed_tokens)
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # one step's earlier output for this request finished it
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]
        for request_id, error in message.failed.items():
            if request_id in pending:
                continue  # the aborted namesake's failure, not this request's
            self.metrics.record_abort(request_id)
            stream = self._streams.pop(request_id, None)
            if stream is not None:  # refused (a ValueError, a 400) or broken (RequestFailedError, a 500)
                stream.put(error.to_exception() if error.invalid else RequestFailedError(error.message))

    def _fail_all(self, error: BaseException) -> None:
        self._state_reads.fail_all(error)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        self._pending_sequences = 0
        for future in self._embeds.values():
            if not future.done():
                future.set_exception(error)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
