"""The grammar backend built on a worker thread from the manager's start: a build that failed
is reported the same way to every request, without growing what each report holds."""

from __future__ import annotations

import pytest

from folio.config.structured_outputs import StructuredOutputsConfig
from folio.sampling_params import SamplingParams, StructuredOutputsParams
from folio.structured_output import manager as manager_module


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
