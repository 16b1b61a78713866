"""A request id reused right after its abort gets exactly its own outputs: the engine may still
be running a step of the aborted namesake when the new request is sent (threaded engine and
engine process alike)."""

from __future__ import annotations

import asyncio

import pytest

from folio import SamplingParams
from tests.server.harness import make_engine

pytestmark = pytest.mark.slow

OLD, NEW = {"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11]}


async def _run(llm) -> tuple[list[list[int]], list[int]]:
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = [o async for o in llm.generate(NEW, params, "alone")][-1].outputs[0].token_ids
    reused = []
    for round_ in range(6):  # the old request is cut after 1-3 outputs, so its steps are in flight
        stream = llm.generate(OLD, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True), "X")
        for _ in range(1 + round_ % 3):
            await stream.__anext__()
        await stream.aclose()  # aborts "X"
        outputs = [o async for o in llm.generate(NEW, params, "X")]
        assert outputs[-1].finished and outputs[-1].prompt_token_ids == NEW["prompt_token_ids"]
        assert all(len(a.outputs[0].token_ids) < len(b.outputs[0].token_ids) for a, b in zip(outputs, outputs[1:]))
        reused.append(list(outputs[-1].outputs[0].token_ids))
    return reused, list(alone)


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])
def test_a_reused_id_gets_only_its_own_tokens(checkpoint, engine_process):
    async def main():
        llm = make_engine(checkpoint, engine_process=engine_process)
        llm.start()
        try:
            return await _run(llm)
        finally:
            await llm.shutdown()

    reused, alone = asyncio.run(main())
    assert reused == [alone] * len(reused)
