"""EngineLoop: the engine's side of AsyncLLM — take commands, step, report — on a thread or in a process.

The loop talks to its frontend only through two callables: `take(block)` returns the commands
waiting for it (blocking while it has nothing to do), and `emit(message)` hands a message back.
Everything that crosses is a small picklable value, so the same loop runs on a thread of the
server process (EngineThread) or alone in a child process (EngineProcess).

Per iteration: the commands are applied and the adds answered at once (Accepted; a state read,
StateCommand, is answered by a StateAnswer built between steps), then one
step runs and everything it produced goes back together (Stepped). An exception while adding a
request fails that request only; one while processing a request's output too (LLMEngine
isolates those); any other exception from step() ends the loop with Died, since the engine's
state is then unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from folio.engine.wire import finished_request_ids
from folio.logger import init_logger
from folio.lora.request import LoRARequest
from folio.outputs import RequestOutput
from folio.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:  # light at import: `folio serve` starts the engine process before torch loads
    from folio.engine.input_processor import PromptType
    from folio.engine.engine_stats import EngineStats

logger = init_logger(__name__)


# ---- commands (frontend -> engine) ------------------------------------------------------------


@dataclass(frozen=True)
class AddCommand:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    priority: int = 0
    lora_request: LoRARequest | None = None


@dataclass(frozen=True)
class LoRACommand:
    """Load (lora_request set) or unload (remove_id set) an adapter; answered like an add."""

    command_id: str
    lora_request: LoRARequest | None = None
    remove_id: int | None = None


@dataclass(frozen=True)
class AbortCommand:
    request_id: str


@dataclass(frozen=True)
class EmbedCommand:
    """Pool the final hidden states of token prompts between two steps (worker/pooler.py)."""

    request_id: str
    prompts: list[list[int]]
    pooler_config: Any  # worker.pooler.PoolerConfig (kept untyped: this module imports no torch)


@dataclass(frozen=True)
class StateCommand:
    """Ask for the engine's state (core/engine_state.py), answered by a StateAnswer with the ticket."""

    ticket: int
    with_blocks: bool = False


@dataclass(frozen=True)
class StopCommand:
    """Abort everything unfinished and end the loop."""


# ---- messages (engine -> frontend) --------------------------------------------------------------


@dataclass(frozen=True)
class RequestError:
    """Why an add failed, in a form that pickles (exceptions with custom __init__ do not)."""

    message: str
    param: str | None = None
    invalid: bool = True  # the request was refused as invalid (a 400), not broken by a bug

    @classmethod
    def of(cls, error: Exception) -> RequestError:
        if isinstance(error, ValueError):
            return cls(str(error), getattr(error, "param", None))
        return cls(f"{type(error).__name__}: {error}", invalid=False)

    def to_exception(self) -> Exception:
        if not self.invalid:
            return RuntimeError(self.message)
        return SamplingParamsError(self.param, self.message) if self.param else ValueError(self.message)


@dataclass(frozen=True)
class Accepted:
    """Answers to adds: (request id, n, None or why it was refused), with the stats after them."""

    results: list[tuple[str, int, RequestError | None]]
    stats: EngineStats


@dataclass(frozen=True)
class Stepped:
    outputs: list[RequestOutput]
    failed: dict[str, RequestError]  # request id -> why it failed after it was added (invalid: its own content)
    stats: EngineStats
    seconds: float  # inside step()


@dataclass(frozen=True)
class Embedded:
    """The answer to an EmbedCommand: one vector per prompt, or why it failed."""

    request_id: str
    embeddings: list[list[float]] | None
    error: RequestError | None = None


@dataclass(frozen=True)
class StateAnswer:
    ticket: int
    state: dict[str, Any] | None  # None: the state could not be built (error says why)
    error: str | None = None


@dataclass(frozen=True)
class Stopped:
    stats: EngineStats


@dataclass(frozen=True)
class Died:
    message: str


class EngineLoop:
    def __init__(self, engine: Any, take: Callable[[bool], list[Any]], emit: Callable[[Any], None]) -> None:
        self.engine = engine
        self.take = take
        self.emit = emit
        self._live: set[str] = set()  # accepted and not finished

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - whatever it was, the frontend must hear of it
            logger.exception("The engine loop failed; every request in flight fails with it.")
            self.emit(Died(f"The engine stopped after an error ({e!r}); restart the server."))

    def _run(self) -> None:
        while True:
            commands = self.take(not self.engine.has_unfinished_requests())
            if any(isinstance(c, StopCommand) for c in commands):
                self._abort_live()
                self.emit(Stopped(self.engine.stats()))
                return
            results = self._apply(commands)
            if results:  # answer the adds now: their callers need not wait for the step
                self.emit(Accepted(results, self.engine.stats()))
            if not self.engine.has_unfinished_requests():
                if any(not isinstance(c, StateCommand) for c in commands):  # aborts changed the stats
                    self.emit(Stepped([], {}, self.engine.stats(), 0.0))
                continue
            start = time.perf_counter()
            outputs = self.engine.step()
            seconds = time.perf_counter() - start
            self._live.difference_update(finished_request_ids(outputs))
            failed = self._take_failed()
            self.emit(Stepped(outputs, failed, self.engine.stats(), seconds))

    def _apply(self, commands: list[Any]) -> list[tuple[str, int, RequestError | None]]:
        results = []
        for command in commands:
            if isinstance(command, StateCommand):
                self.emit(self._state(command))
                continue
            if isinstance(command, AbortCommand):
                if command.request_id in self._live:
                    self._live.discard(command.request_id)
                    self.engine.abort_request(command.request_id)
                continue
            if isinstance(command, EmbedCommand):
                self.emit(self._embed(command))
                continue
            if isinstance(command, LoRACommand):
                results.append((command.command_id, 0, self._apply_lora(command)))
                continue
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params,
                                        priority=command.priority, lora_request=command.lora_request)
            except Exception as e:  # an invalid request: its caller gets the error
                results.append((command.request_id, command.params.n, RequestError.of(e)))
                continue
            self._live.add(command.request_id)
            results.append((command.request_id, command.params.n, None))
        return results

    def _embed(self, command: EmbedCommand) -> Embedded:
        try:
            vectors = self.engine.embed(command.prompts, command.pooler_config)
        except Exception as e:  # an invalid prompt, or a bug: the caller gets the error
            return Embedded(command.request_id, None, RequestError.of(e))
        return Embedded(command.request_id, vectors)

    def _state(self, command: StateCommand) -> StateAnswer:
        """A read of the scheduler between steps; a failure here fails the read, not the engine."""
        try:
            return StateAnswer(command.ticket, self.engine.engine_state(command.with_blocks))
        except Exception as e:  # noqa: BLE001 - reported to the caller
            logger.exception("Building the engine state failed.")
            return StateAnswer(command.ticket, None, f"{type(e).__name__}: {e}")

    def _apply_lora(self, command: LoRACommand) -> RequestError | None:
        try:
            if command.lora_request is not None:
                self.engine.add_lora(command.lora_request)
            else:  # an adapter pushed out of the CPU cache is not loaded: nothing to remove
                self.engine.remove_lora(command.remove_id)
        except Exception as e:  # noqa: BLE001 - a bad adapter is its caller's error
            return RequestError.of(e)
        return None

    def _take_failed(self) -> dict[str, RequestError]:
        failed = {}
        for request_id, error in self.engine.take_request_errors().items():
            self._live.discard(request_id)
            if isinstance(error, SamplingParamsError):  # its own parameters (e.g. its constraint): the caller's error
                logger.warning("Request %s refused after it was added: %s", request_id, error)
                failed[request_id] = RequestError.of(error)
            else:
                logger.error("Request %s failed and was dropped: %r", request_id, error, exc_info=error)
                failed[request_id] = RequestError(f"Request {request_id} failed: {error!r}", invalid=False)
        return failed

    def _abort_live(self) -> None:
        if self._live:
            self.engine.abort_request(list(self._live))
            self._live.clear()
