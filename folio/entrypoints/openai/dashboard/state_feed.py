"""StateFeed: one engine-state read every UPDATE_INTERVAL_S, shared by every open SSE stream.

The feed reads only while someone watches: the first subscriber starts its task, the last one
to leave stops it, so an unwatched server pays nothing. Each read is serialized once per
variant (with or without the block map: the map is read only while a subscriber asked for it)
and handed to every subscriber's one-slot mailbox; a subscriber too slow to take an update
finds only the newest one waiting, never a backlog.

The per-second series change once a second while updates come four times as often: an event
carries "series" only when it differs from the last series that subscriber was sent (its first
event always has it). The block map, the costly part of a read for the engine, is read every
BLOCK_MAP_EVERY-th update (about once a second; at once for a new subscriber that asked for it);
events without one leave "blocks" out. So most events carry only the queues and counters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from folio.engine.async_llm import AsyncLLM, EngineDeadError
from folio.logger import init_logger

logger = init_logger(__name__)

UPDATE_INTERVAL_S = 0.25  # ~4 updates a second
BLOCK_MAP_EVERY = 4  # reads: the block map (the costly part) refreshes about once a second


def encode_state(state: Any) -> str:
    return json.dumps(state, separators=(",", ":"), allow_nan=False)


class _Subscriber:
    def __init__(self, with_blocks: bool) -> None:
        self.with_blocks = with_blocks
        self.series_version = -1  # of the last series it was sent
        self.has_map = False  # it was sent a block map
        self.mailbox: asyncio.Queue[str | None] = asyncio.Queue(maxsize=1)  # None: the feed ended

    def deliver(self, event: str | None) -> None:
        if self.mailbox.full():
            self.mailbox.get_nowait()  # drop the stale update
        self.mailbox.put_nowait(event)


class StateFeed:
    def __init__(self, engine: AsyncLLM, interval_s: float = UPDATE_INTERVAL_S) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self._subscribers: set[_Subscriber] = set()
        self._task: asyncio.Task | None = None
        self.num_reads = 0  # since start, for tests and measurements
        self._series: Any = None
        self._series_version = 0

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    async def events(self, with_blocks: bool) -> AsyncIterator[str]:
        """Server-sent events, one `data: <state JSON>` per update, until the engine stops
        (then one `event: end`) or the consumer stops iterating."""
        subscriber = _Subscriber(with_blocks)
        self._subscribers.add(subscriber)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="folio-state-feed")
        try:
            while True:
                event = await subscriber.mailbox.get()
                if event is None:
                    yield "event: end\ndata: {}\n\n"
                    return
                yield event
        finally:
            self._subscribers.discard(subscriber)
            if not self._subscribers and self._task is not None:
                self._task.cancel()
                self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._subscribers:
            started = loop.time()
            try:
                await self._publish()
            except EngineDeadError:
                self._end_all()
                return
            except Exception:  # noqa: BLE001 - a failed read must not end the feed
                logger.exception("Reading the engine state for the dashboard failed.")
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    async def _publish(self) -> None:
        mapped = [s for s in self._subscribers if s.with_blocks]
        with_blocks = bool(mapped) and (self.num_reads % BLOCK_MAP_EVERY == 0 or not all(s.has_map for s in mapped))
        state = await self.engine.engine_state(with_blocks)
        self.num_reads += 1
        series = state.pop("series", None)
        if series != self._series:
            self._series, self._series_version = series, self._series_version + 1
        plain = _without_blocks(state)
        bodies = {False: encode_state(plain), True: encode_state(state) if with_blocks else None}
        series_json = encode_state(series)
        for subscriber in list(self._subscribers):
            gets_map = with_blocks and subscriber.with_blocks
            subscriber.has_map |= gets_map
            body = bodies[gets_map]
            if subscriber.series_version != self._series_version:
                subscriber.series_version = self._series_version
                body = f'{body[:-1]},"series":{series_json}}}'
            subscriber.deliver(f"data: {body}\n\n")

    def _end_all(self) -> None:
        for subscriber in list(self._subscribers):
            subscriber.deliver(None)


def _without_blocks(state: dict[str, Any]) -> dict[str, Any]:
    """The state minus its block map ("blocks" absent: the reader keeps the map it has)."""
    queues = state["queues"]
    if state.get("blocks") is not None:
        queues = {k: [_drop_block_ids(r) for r in v] if isinstance(v, list) else v for k, v in queues.items()}
    return {**{k: v for k, v in state.items() if k != "blocks"}, "queues": queues}


def _drop_block_ids(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k not in ("block_ids", "cpu_block_ids")}
