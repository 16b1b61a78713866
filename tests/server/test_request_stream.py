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


def test_cumulative_outputs_that_queued_up_arrive_as_the_latest_not_concatenated():
    """A CUMULATIVE output already holds everything before it (AsyncLLM's default kind): two that
    piled up must give the second, not the first's tokens twice."""
    def cumulative(index, text, ids, finish=None):
        return _delta(index, text, ids, finish)

    queued = [cumulative(0, "a", [1]), cumulative(1, "x", [7]), cumulative(0, "ab", [1, 2]),
              cumulative(0, "abc", [1, 2, 3], "stop")]
    merged = merge_outputs(queued, cumulative=True)
    assert [(c.index, c.text, c.token_ids) for c in merged.outputs] == [(0, "abc", [1, 2, 3]), (1, "x", [7])]
    assert merged.finished and merged.outputs[0].finish_reason == "stop"

    async def main():
        stream = RequestStream("r", lambda _: None, cumulative=True)
        for output in (queued[0], queued[2], queued[3]):
            stream.put(output)
        return await anext(stream)

    assert asyncio.run(main()).outputs[0].token_ids == [1, 2, 3]


def test_outputs_queued_before_an_error_are_delivered_before_it():
    """A review: an error queued behind outputs was raised at once and the outputs were dropped."""

    async def main():
        stream = RequestStream("r", lambda _: None)
        stream.put(_delta(0, "a", [1]))
        stream.put(_delta(0, "b", [2]))
        stream.put(RuntimeError("engine step failed"))
        stream.put(_delta(0, "never", [9]))  # nothing after an error is read
        output = await anext(stream)
        assert (output.outputs[0].text, output.outputs[0].token_ids) == ("ab", [1, 2])
        with pytest.raises(RuntimeError, match="engine step failed"):
            await anext(stream)
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    asyncio.run(main())
