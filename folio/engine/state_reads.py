"""StateReads: AsyncLLM's reads of the engine's state (core/engine_state.py), by ticket.

A read sends a StateCommand to the engine loop, which answers between two steps with a
StateAnswer carrying the same ticket; the answer resolves the read's future on the event loop.
The same path serves an engine thread and an engine process (the state is a plain dict, which
pickles cheaply), and a read never touches the scheduler from another thread.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from folio.engine.engine_loop import StateAnswer, StateCommand


class StateReads:
    def __init__(self, send: Callable[[Any], None]) -> None:
        self._send = send
        self._tickets = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}  # event-loop side only

    async def read(self, with_blocks: bool) -> dict[str, Any]:
        """The engine's state; raises what fail_all was given if the engine stops first."""
        ticket = next(self._tickets)
        future = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = future
        try:
            self._send(StateCommand(ticket, with_blocks))
            return await future
        finally:
            self._waiting.pop(ticket, None)

    def answer(self, message: StateAnswer) -> None:
        future = self._waiting.pop(message.ticket, None)
        if future is None or future.done():
            return  # its reader gave up
        if message.state is None:
            future.set_exception(RuntimeError(message.error or "The engine state could not be built."))
        else:
            future.set_result(message.state)

    def fail_all(self, error: BaseException) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()
