"""Grammar work off the engine's start and step loop: the backend built on a worker thread from
the manager's start (a build that failed is reported the same way to every request, without
growing what each report holds), and grammars compiled on worker threads (a compile in progress
or failed holds up no other request)."""

from __future__ import annotations

import re

import pytest

from folio import LLM
from folio.config.structured_outputs import StructuredOutputsConfig
from folio.sampling_params import SamplingParams, StructuredOutputsParams
from folio.structured_output import manager as manager_module

PROMPTS = ["Hello, my name is", "The answer is"]


def _traceback_length(error: BaseException) -> int:
    tb, n = error.__traceback__, 0
    while tb is not None:
        tb, n = tb.tb_next, n + 1
    return n


class _AcceptsAll:
    def check(self, spec) -> None:
        pass


@pytest.mark.parametrize(("backend", "error"), [("xgrammar", RuntimeError), ("auto", ValueError)])
def test_a_failed_build_does_not_pile_up_frames_on_its_error(monkeypatch, backend, error):
    """The failed build's exception is re-raised to each request; re-raising the same object
    adds that call's frames to its traceback, so every request kept the frames (and their
    locals: params, prompts) of all earlier ones alive. Under "auto" guidance serves a spec
    xgrammar's failed build refuses, yet that failure was raised (and caught) on every check."""
    failure = error("no tables for this tokenizer")

    def make_backend(name, *args):
        if name == "guidance":
            return _AcceptsAll()
        raise failure

    monkeypatch.setattr(manager_module, "make_backend", make_backend)
    config = StructuredOutputsConfig(backend=backend)
    manager = manager_module.StructuredOutputManager(config, tokenizer=object(), vocab_size=8, stop_token_ids={0})
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[ab]+"))
    try:
        manager._backends[manager.default_backend_name].exception()  # the build has failed
        stored, raised = _traceback_length(failure), []
        for i in range(5):
            if backend == "auto":
                params = SamplingParams(structured_outputs=StructuredOutputsParams(regex=f"[ab]{{{i + 1}}}"))
                assert manager.check(params) is not None  # guidance took it
            else:
                with pytest.raises(RuntimeError, match="no tables") as caught:
                    manager.backend
                raised.append(_traceback_length(caught.value))
            assert _traceback_length(failure) == stored  # the stored failure holds no caller's frames
        assert len(set(raised)) <= 1, raised  # each request's error holds its own frames only
    finally:
        manager.shutdown()


def test_a_failed_build_keeps_its_error_type_when_it_does_not_copy(monkeypatch):
    """An exception whose __init__ takes other arguments than its args (SamplingParamsError) is
    raised itself, its traceback cleared first: still a 400 with the param it names."""
    from folio.sampling_params import SamplingParamsError

    failure = SamplingParamsError("structured_outputs", "this tokenizer has no byte tokens")
    monkeypatch.setattr(manager_module, "make_backend", lambda *args: (_ for _ in ()).throw(failure))
    manager = manager_module.StructuredOutputManager(StructuredOutputsConfig(backend="xgrammar"), object(), 8, {0})
    try:
        lengths = []
        for _ in range(3):
            with pytest.raises(SamplingParamsError, match="no byte tokens") as caught:
                manager.check(SamplingParams(structured_outputs=StructuredOutputsParams(regex="[ab]+")))
            assert caught.value.param == "structured_outputs"
            lengths.append(_traceback_length(caught.value))
        assert len(set(lengths)) == 1, lengths
    finally:
        manager.shutdown()


@pytest.mark.slow
def test_a_compiling_grammar_does_not_stall_other_requests(checkpoint):
    """Grammars compile on a worker thread: while one is held, an unconstrained request added
    after it runs to the end; then the constrained one runs."""
    import threading

    engine = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=512, seed=0).llm_engine
    release = threading.Event()
    manager = engine.structured_output
    compile_now = manager.backend.compile
    manager.backend.compile = lambda spec: (release.wait(60), compile_now(spec))[1]
    constrained = SamplingParams(temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(regex=r"[a-z]{5}"))
    engine.add_request("slow", PROMPTS[0], constrained)
    engine.add_request("free", PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    finished: dict[str, object] = {}
    while "free" not in finished:
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert "slow" not in finished and manager.has_parked
    release.set()
    while "slow" not in finished:
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert re.fullmatch(r"[a-z]{5}", finished["slow"].outputs[0].text)


@pytest.mark.slow
def test_a_compile_failure_fails_that_request_only(checkpoint):
    llm = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=512, seed=0)
    manager = llm.llm_engine.structured_output

    def broken(spec):
        raise RuntimeError("backend exploded")

    manager.backend.compile = broken
    params = SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(regex="[ab]+"))
    with pytest.raises(RuntimeError, match="failed to compile: backend exploded"):  # the server's fault, not a 400
        llm.generate("x", params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    (ok,) = llm.generate("x", SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(ok.outputs[0].token_ids) == 3
    # The failure is not cached: once the backend works again, the same constraint compiles.
    del manager.backend.compile
    (again,) = llm.generate("x", params, use_tqdm=False)
    assert re.fullmatch("[ab]+", again.outputs[0].text)


@pytest.mark.slow
def test_the_backend_builds_off_the_engine_start_and_step_loop(checkpoint, monkeypatch):
    """The backend (xgrammar's vocabulary tables: ~1 s for a 150k vocabulary) is built on a worker
    thread begun with the engine: the engine starts and serves free requests while it is held;
    the build's time is kept for the benchmark and a constrained request then runs."""
    import threading

    from folio.structured_output import manager as manager_module

    release, started = threading.Event(), threading.Event()
    build_now = manager_module.make_backend

    def slow_build(*args):
        started.set()
        release.wait(60)
        return build_now(*args)

    monkeypatch.setattr(manager_module, "make_backend", slow_build)
    llm = LLM(model=checkpoint, dtype="float32", device="cpu", max_model_len=512, seed=0)
    assert started.wait(10)  # begun by the engine's start, which did not wait for it
    (free,) = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(free.outputs[0].token_ids) == 4 and not release.is_set()
    manager = llm.llm_engine.structured_output
    assert manager.backend_build_seconds == {}
    release.set()
    params = SamplingParams(temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(regex=r"[a-z]{5}"))
    (constrained,) = llm.generate(PROMPTS[1], params, use_tqdm=False)
    assert re.fullmatch(r"[a-z]{5}", constrained.outputs[0].text)
    assert manager.backend_build_seconds["xgrammar"] > 0
