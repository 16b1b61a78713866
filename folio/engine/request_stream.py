"""RequestStream: one request's outputs on the server's event loop, merged when they queue up.

AsyncLLM (engine/async_llm.py) puts each of a request's RequestOutputs (or the error that ends
it) into its stream; a handler that reads slower than the engine steps gets the outputs that
piled up as one (merge_outputs: DELTA outputs concatenate, CUMULATIVE ones keep the latest).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import replace
from typing import Any

from folio.outputs import CompletionOutput, RequestOutput


class RequestStream:
    """One request's outputs, in order. Iterate it; outputs that queued up arrive merged.

    Lives on the event loop. `abort()` (or leaving an `async with` early) tells the engine to
    drop the request and free its KV blocks.
    """

    def __init__(self, request_id: str, on_abort, cumulative: bool = False) -> None:
        self.request_id = request_id
        self.cumulative = cumulative  # each output holds everything so far (RequestOutputKind.CUMULATIVE)
        self.finished = False
        self._items: deque[RequestOutput | BaseException] = deque()
        self._ready = asyncio.Event()
        self._on_abort = on_abort
        # What the consumer has read, for end_with_abort: the last output, the choices finished.
        self._last: RequestOutput | None = None
        self._finished_choices: set[int] = set()

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

    async def started(self) -> None:
        """Wait until the engine answered with a first item, without consuming an output.

        A handler calls it before committing to a response (an event stream's 200): an error
        that comes first (a request refused after it was added) is consumed and raised here, so
        it can still become an HTTP error; an output stays queued for iteration, in order.
        """
        while not self._items:
            if self.finished:  # aborted, or already read to its end: nothing more will come
                return
            self._ready.clear()
            await self._ready.wait()
        first = self._items[0]
        if isinstance(first, BaseException):
            self._items.clear()  # as in __anext__: an error ends the request
            self.finished = True
            raise first

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished and not self._items:
            raise StopAsyncIteration
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        if isinstance(self._items[0], BaseException):
            self.finished = True
            error = self._items.popleft()
            self._items.clear()  # an error ends the request: nothing after it is read
            raise error
        # The outputs queued before an error come first (merged); the error is raised next time.
        items = []
        while self._items and not isinstance(self._items[0], BaseException):
            items.append(self._items.popleft())
        output = merge_outputs(items, self.cumulative)
        self._last = output
        if output.finished:
            self.finished = True
        else:
            for c in output.outputs:
                if c.finish_reason is not None:
                    self._finished_choices.add(c.index)
        return output

    def end_with_abort(self, num_choices: int) -> None:
        """Drop the engine request and queue a last output closing each of its num_choices
        choices still open with finish_reason "abort", so the consumer ends the stream as it
        ends a finished one (a shutdown out of time; the engine sends nothing for an abort).
        A no-op for a stream that ended or whose end (last output or error) is queued."""
        if self.finished:
            return
        queued = [item for item in self._items if not isinstance(item, BaseException)]
        if len(queued) < len(self._items) or any(o.finished for o in queued):
            return
        done = self._finished_choices.union(
            c.index for o in queued for c in o.outputs if c.finish_reason is not None)
        last = queued[-1] if queued else self._last
        self.abort()  # first: AsyncLLM forgets the request, so nothing comes after this output
        choices = [CompletionOutput(i, "", [], None, None, finish_reason="abort")
                   for i in range(num_choices) if i not in done]
        self.put(RequestOutput(self.request_id, None, list(last.prompt_token_ids) if last else [], None, choices,
                               finished=True, num_cached_tokens=last.num_cached_tokens if last else 0))


def merge_outputs(outputs: list[RequestOutput], cumulative: bool = False) -> RequestOutput:
    """Fold consecutive outputs of one request into one: DELTA completions concatenate, a
    CUMULATIVE completion already holds what came before and replaces it (FINAL_ONLY has one)."""
    if len(outputs) == 1:
        return outputs[0]
    by_index: dict[int, CompletionOutput] = {}
    for output in outputs:
        for c in output.outputs:
            seen = by_index.get(c.index)
            by_index[c.index] = c if seen is None or cumulative else _concat(seen, c)
    return replace(
        outputs[-1],
        outputs=[by_index[i] for i in sorted(by_index)],
        num_cached_tokens=max(o.num_cached_tokens for o in outputs),
        # An engine process sends prompt log-probs once, with the first output that has tokens.
        prompt_logprobs=next((o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None), None),
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
