"""The server's fast paths for taking a request in (issue 11): a token-id prompt validated in one
pass, and a single prompt added to the engine without a task and a gather. Each must behave
exactly as the general path does: the same values, the same errors, the same withdrawal."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from pydantic import ConfigDict, TypeAdapter, ValidationError

from folio.config.scheduler import SchedulerConfig
from folio.engine.async_llm import AsyncLLM, EngineDeadError, QueueFullError, RequestStream
from folio.engine.engine_loop import AbortCommand, AddCommand
from folio.engine.engine_stats import EngineStats
from folio.entrypoints.openai.errors import BadRequestError, ServiceUnavailableError
from folio.entrypoints.openai.protocol import CompletionRequest
from folio.entrypoints.openai.protocol.common import prompt_problem
from folio.entrypoints.openai.protocol.completion import Prompt
from folio.entrypoints.openai.serving_engine import EnginePrompt, OpenAIServing
from folio.sampling_params import SamplingParams, SamplingParamsError

# The union alone, as the model validates it (strict), without the fast path in front of it.
UNION = TypeAdapter(Prompt, config=ConfigDict(strict=True))


def _outcome(validate, value):
    try:
        return "ok", validate(value)
    except ValidationError as e:
        return "error", [(x["type"], x["loc"][-1:] if x["loc"] else (), x["msg"]) for x in e.errors()]


@pytest.mark.parametrize("prompt", [
    [5], [0, 1, 2, 151935], list(range(1000)), [10**30], [2**63],
    [1, True], [True], [False, 1], [1, -1], [-1], [1, "a"], [1, 2.0], [1.0], [1, None], [1, [2]],
    [[1], 2], ["a", 1], [], [[]], [[1, 2], [3]], [[1, -2]], ["a", "b"], [""], "hi", "", None, 5, {"a": 1},
])
def test_token_id_prompts_validate_as_the_union_does(prompt):
    body = {"prompt": prompt, "max_tokens": 3}
    fast = _outcome(lambda v: CompletionRequest.model_validate({**body, "prompt": v}).prompt, prompt)
    union = _outcome(UNION.validate_python, prompt)
    words = prompt_problem(prompt, "prompt") if union[0] == "error" else None
    if words is not None:  # what the union refuses, the model says in words where it can
        union = ("error", [("value_error", ("prompt",), f"Value error, {words}")])
    assert fast == union
    if fast[0] == "ok":
        assert type(fast[1]) is type(union[1])
        if isinstance(prompt, list):
            assert fast[1] is not prompt  # a copy, as the union makes


def test_token_id_prompt_validation_errors_name_the_prompt():
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": [3, -1]})
    assert {e["loc"][0] for e in info.value.errors()} == {"prompt"}


# ---- adding one prompt ---------------------------------------------------------------------------


class StubCore:
    """An engine core that records commands and answers nothing by itself."""

    engine = None
    tokenizer = None
    model_config = SimpleNamespace(max_model_len=64, vocab_size=100, served_model_name="m")
    initial_stats = EngineStats(0, 0, 1, 1, 0.0, 0)
    scheduler_config = SchedulerConfig()
    default_params = SamplingParams()

    def __init__(self) -> None:
        self.sent: list = []

    def start(self, deliver) -> None:
        pass

    def send(self, command) -> None:
        self.sent.append(command)


def _serving(llm) -> OpenAIServing:
    return OpenAIServing(llm, "m")


def test_one_prompt_waits_for_its_accept_and_is_withdrawn_when_cancelled():
    async def main():
        core = StubCore()
        llm = AsyncLLM(core=core)
        llm.start()
        serving = _serving(llm)
        add = asyncio.ensure_future(serving.add_requests(
            "cmpl-1", [EnginePrompt([1, 2, 3])], [SamplingParams(max_tokens=2)]))
        await asyncio.sleep(0)
        assert [type(c) for c in core.sent] == [AddCommand]
        assert core.sent[0].request_id == "cmpl-1" and core.sent[0].prompt == {"prompt_token_ids": [1, 2, 3]}
        assert not add.done()  # no Accepted yet
        add.cancel()
        with pytest.raises(asyncio.CancelledError):
            await add
        assert isinstance(core.sent[-1], AbortCommand) and core.sent[-1].request_id == "cmpl-1"
        assert llm.num_in_flight == 0

    asyncio.run(main())


class RefusingEngine:
    """add_request and add_requests raise what AsyncLLM's can raise."""

    tokenizer = None
    model_config = StubCore.model_config

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    async def add_request(self, *args, **kwargs) -> RequestStream:
        raise self.error

    async def add_requests(self, *args, **kwargs) -> list[RequestStream]:  # several prompts at once
        raise self.error


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("error, expected, param", [
    (SamplingParamsError("max_tokens", "too many"), BadRequestError, "max_tokens"),
    (ValueError("bad prompt"), BadRequestError, None),
    (QueueFullError("full"), ServiceUnavailableError, None),
    (EngineDeadError("dead"), ServiceUnavailableError, None),
])
def test_add_errors_map_alike_for_one_prompt_and_several(n, error, expected, param):
    serving = _serving(RefusingEngine(error))
    prompts, params = [EnginePrompt([1])] * n, [SamplingParams()] * n
    with pytest.raises(expected) as info:
        asyncio.run(serving.add_requests("cmpl-1", prompts, params))
    assert str(error) in str(info.value)
    assert getattr(info.value, "param", None) == param


@pytest.mark.parametrize("ids, bad", [([1, 2, 99], None), ([], None), ([5, 100, 3, 250], 100), ([7, -3, 100], -3)])
def test_token_ids_are_checked_in_one_pass_and_the_first_bad_one_named(ids, bad):
    serving = _serving(AsyncLLM(core=StubCore()))  # vocabulary of 100
    if bad is None:
        serving.check_token_ids(ids, "prompt")
        return
    with pytest.raises(BadRequestError, match=rf"Token id {bad} is outside the vocabulary \[0, 100\)"):
        serving.check_token_ids(ids, "prompt")
