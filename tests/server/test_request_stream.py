"""RequestStream and merge_outputs: deltas that queued up while the client was slow arrive as one."""

from __future__ import annotations

import asyncio

import pytest

from folio.engine.async_llm import RequestStream, merge_outputs
from folio.outputs import CompletionOutput, Logprob, RequestOutput


def _delta(index: int, text: str, ids: list[int], finish: str | None = None, prompt_logprobs=None) -> RequestOutput:
    logprobs = [{i: Logprob(-1.0)} for i in ids]
    return RequestOutput("r", "p", [1, 2], prompt_logprobs, [CompletionOutput(index, text, ids, -1.0 * len(ids), logprobs, finish)],
                         finish is not None)


def test_merge_concatenates_each_choice_and_keeps_the_last_state():
    first = _delta(0, "a", [1], prompt_logprobs=[None, {2: Logprob(-0.5)}])
    merged = merge_outputs([first, _delta(1, "x", [7]), _delta(0, "bc", [2, 3]), _delta(0, "", [], "stop")])
    assert [c.index for c in merged.outputs] == [0, 1]
    zero = merged.outputs[0]
    assert (zero.text, zero.token_ids, zero.finish_reason) == ("abc", [1, 2, 3], "stop")
    assert len(zero.logprobs) == 3 and merged.finished
    assert merged.prompt_logprobs == first.prompt_logprobs


def test_a_stream_yields_merged_outputs_then_stops_and_aborts_only_if_unfinished():
    aborted = []

    async def main():
        stream = RequestStream("r", aborted.append)
        stream.put(_delta(0, "a", [1]))
        stream.put(_delta(0, "b", [2]))
        first = await anext(stream)
        stream.put(_delta(0, "c", [3], "length"))
        last = await anext(stream)
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        stream.abort()
        failing = RequestStream("f", aborted.append)
        failing.put(RuntimeError("engine died"))
        with pytest.raises(RuntimeError):
            await anext(failing)
        left = RequestStream("l", aborted.append)
        async with left:
            pass
        return first, last

    first, last = asyncio.run(main())
    assert first.outputs[0].text == "ab" and last.outputs[0].text == "c" and last.finished
    assert aborted == ["l"]
