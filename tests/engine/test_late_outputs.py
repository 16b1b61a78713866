"""An output that reaches AsyncLLM after its request was aborted (the caller left while the step
ran) must not recreate the per-request metrics the abort removed; and the EngineProcess reader
reports an output it cannot decode as the engine's death instead of dying silently."""

from __future__ import annotations

from types import SimpleNamespace

from folio.engine.async_llm import AsyncLLM
from folio.engine.engine_loop import Died, Stepped
from folio.engine.engine_stats import EngineStats
from folio.outputs import CompletionOutput, RequestOutput


class _Core:
    engine = None
    model_config = SimpleNamespace(served_model_name="m")
    initial_stats = EngineStats(0, 0, 1, 1, 0.0, 0)

    def send(self, command) -> None:
        raise AssertionError("nothing is sent to the engine here")


def _output(request_id: str) -> RequestOutput:
    return RequestOutput(request_id=request_id, prompt="p", prompt_token_ids=[1, 2], prompt_logprobs=None,
                         outputs=[CompletionOutput(index=0, text="a", token_ids=[3], cumulative_logprob=None, logprobs=None)], finished=False)


def test_an_aborted_requests_late_output_leaves_no_tally():
    llm = AsyncLLM(core=_Core())
    llm.metrics.record_abort("gone")
    llm._on_step(Stepped(outputs=[_output("gone")], failed={}, stats=_Core.initial_stats, seconds=0.01))
    assert "gone" not in llm.metrics._tallies
    # A request that still has a stream is counted as before.
    llm._streams["live"] = SimpleNamespace(put=lambda output: None)
    llm._on_step(Stepped(outputs=[_output("live")], failed={}, stats=_Core.initial_stats, seconds=0.01))
    assert "live" in llm.metrics._tallies


def test_a_step_the_reader_cannot_decode_is_the_engines_death():
    from folio.engine.engine_core import EngineProcess

    delivered = []

    class _Conn:
        def __init__(self):
            self.messages = [Stepped(outputs=[("bad",)], failed={}, stats=None, seconds=0.0)]

        def recv(self):
            return self.messages.pop(0)

    reader = EngineProcess.__new__(EngineProcess)
    reader._conn = _Conn()
    reader._wire = SimpleNamespace(decode=lambda record: record[1], forget=lambda request_id: None)
    reader._read(delivered.append)  # returns instead of raising in its thread
    assert len(delivered) == 1 and isinstance(delivered[0], Died)
    assert "could not read the engine's output" in delivered[0].message
