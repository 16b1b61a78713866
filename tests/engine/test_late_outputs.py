"""An output that reaches AsyncLLM after its request was aborted (the caller left while the step
ran) must not recreate the per-request metrics the abort removed; and the EngineProcess reader
reports an output it cannot decode as the engine's death instead of dying silently."""

from __future__ import annotations

from types import SimpleNamespace

from folio.config.scheduler import SchedulerConfig
from folio.engine.async_llm import AsyncLLM
from folio.engine.engine_loop import Died, RequestError, Stepped
from folio.engine.engine_stats import EngineStats
from folio.outputs import CompletionOutput, RequestOutput


class _Core:
    engine = None
    model_config = SimpleNamespace(served_model_name="m")
    initial_stats = EngineStats(0, 0, 1, 1, 0.0, 0)
    scheduler_config = SchedulerConfig()

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
    reader._wire = SimpleNamespace(decode=lambda record: record[1], failed=lambda request_id: None)
    reader._read(delivered.append)  # returns instead of raising in its thread
    assert len(delivered) == 1 and isinstance(delivered[0], Died)
    assert "could not read the engine's output" in delivered[0].message


def _finished(request_id: str, token: int) -> RequestOutput:
    out = _output(request_id)
    out.outputs[0].token_ids = [token]
    out.finished = True
    return out


def test_a_reused_ids_stale_output_does_not_reach_the_new_request():
    """Abort "X", add "X" again at once: a step the engine ran before it saw the abort still
    carries the old X (finished, even). The new X's add is not yet accepted then, so that output
    is the namesake's: dropped, and the new stream neither gets its tokens nor ends with it."""
    import asyncio

    llm = AsyncLLM(core=_Core())
    got = []
    llm._streams["X"] = SimpleNamespace(put=got.append)
    llm._pending["X"] = asyncio.new_event_loop().create_future()  # added, not yet accepted
    stats = _Core.initial_stats
    llm._on_step(Stepped(outputs=[_finished("X", 111)], failed={"X": RequestError("the old one failed", invalid=False)}, stats=stats, seconds=0.0))
    assert got == [] and "X" in llm._streams
    del llm._pending["X"]  # Accepted: from now on the outputs are the new X's
    llm._on_step(Stepped(outputs=[_finished("X", 222)], failed={}, stats=stats, seconds=0.0))
    assert [o.outputs[0].token_ids for o in got] == [[222]] and "X" not in llm._streams


def test_the_wire_decoder_keeps_a_reused_ids_state_from_its_namesakes_records():
    from folio.engine.wire import WireDecoder

    wire = WireDecoder()
    wire.add("X", "old prompt", [1, 2])
    wire.accepted(["X"])
    wire.forget("X")  # aborted
    wire.add("X", "new prompt", [7, 8, 9])  # the same id, sent before the engine saw the abort
    stale_streamed = ("X", "old", [5], ("length", None), 1.0)
    stale_full = ("X", [(0, "old", [5], None, None, "length", None)], True, None, 0, None)
    for record in (stale_streamed, stale_full):
        out = wire.decode(record)
        assert out.prompt is None and out.outputs[0].token_ids == [5]
    wire.failed("X")  # the namesake's failure
    wire.accepted(["X"])
    out = wire.decode(("X", "new", [6], None, 2.0))
    assert out.prompt == "new prompt" and out.prompt_token_ids == [7, 8, 9] and not out.finished
    out = wire.decode(("X", "new!", [6, 4], ("stop", None), 3.0))
    assert out.prompt == "new prompt" and out.finished and len(wire) == 0
    wire.add("Y", None, [3])
    wire.accepted(["Y"])
    wire.failed("Y")  # an accepted request's failure forgets it
    assert len(wire) == 0
