"""capturing(): the CUDA graph capture's guard against the rest of the process (CPU test with a
stand-in for torch.cuda.graph; the real captures run in the GPU tests)."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from folio.worker import cuda_graphs


@pytest.fixture
def seen(monkeypatch):
    """What the stand-in graph context saw: its arguments and whether the collector was on."""
    record: dict = {}

    @contextlib.contextmanager
    def fake_graph(graph, pool=None, stream=None, capture_error_mode="global"):
        record.update(graph=graph, pool=pool, mode=capture_error_mode, gc_inside=gc.isenabled())
        yield

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    return record


@pytest.fixture
def gc_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_capture_checks_its_own_thread_with_the_collector_off(seen, gc_on):
    with cuda_graphs.capturing("graph", (0, 1)):
        assert not gc.isenabled()
    assert seen == {"graph": "graph", "pool": (0, 1), "mode": "thread_local", "gc_inside": False}
    assert gc.isenabled()


def test_a_failed_capture_turns_the_collector_back_on(seen, gc_on):
    with pytest.raises(RuntimeError, match="capture failed"):
        with cuda_graphs.capturing("graph", None):
            raise RuntimeError("capture failed")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off(seen, gc_on):
    gc.disable()
    with cuda_graphs.capturing("graph", None):
        pass
    assert not gc.isenabled()
