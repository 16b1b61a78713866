"""The start-up heap stays out of the garbage collector's scans while the engine runs: frozen
around LLM.generate's loop and unfrozen after it (the user's process), frozen for good where
folio owns the process, and never unfrozen by a run inside such a process."""

from __future__ import annotations

import gc

import pytest

from folio import LLM, SamplingParams
from folio.engine import startup_heap
from tests.helpers.checkpoints import make_tiny_checkpoint


@pytest.fixture
def llm(tmp_path):
    return LLM(model=make_tiny_checkpoint("llama", tmp_path / "llama"), dtype="float32", device="cpu", max_model_len=64)


def _record_freeze_counts(llm, monkeypatch) -> list[int]:
    counts: list[int] = []
    step = llm.llm_engine.step

    def recording_step():
        counts.append(gc.get_freeze_count())
        return step()

    monkeypatch.setattr(llm.llm_engine, "step", recording_step)
    return counts


def test_generate_freezes_the_heap_only_while_it_runs(llm, monkeypatch):
    assert gc.get_freeze_count() == 0
    counts = _record_freeze_counts(llm, monkeypatch)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [4, 4]
    assert counts and min(counts) > 1000  # the engine's modules and tensors, frozen while stepping
    assert gc.get_freeze_count() == 0  # the user's process collects as before


def test_a_process_frozen_at_start_stays_frozen(llm, monkeypatch):
    counts = _record_freeze_counts(llm, monkeypatch)
    monkeypatch.setattr(startup_heap, "_process_frozen", False)
    try:
        frozen = startup_heap.freeze_startup_heap("test")
        # not ==: a thread left by an earlier test (a server's) may freeze a few objects of its
        # own, and a few frozen objects may die by refcount meanwhile (seen: 8 of 607,059)
        assert frozen > 1000 and abs(gc.get_freeze_count() - frozen) < 0.01 * frozen
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)
        # the run did not unfreeze the owner's heap (a few frozen objects may die by refcount)
        assert counts and gc.get_freeze_count() > 0.9 * frozen
    finally:
        gc.unfreeze()


def test_overlapping_runs_keep_the_heap_frozen_until_the_last_ends():
    """Two threads' generate loops (two LLMs in one process): the first to finish used to
    unfreeze the heap under the other, whose loop then ran with full scans of it again."""
    import threading

    assert gc.get_freeze_count() == 0
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def run_a():
        with startup_heap.frozen_heap_while_running():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def run_b():
        a_in.wait(10)
        with startup_heap.frozen_heap_while_running():
            b_in.set()
            a_out.wait(10)
            seen["b after a"] = gc.get_freeze_count()

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["b after a"] > 0  # still frozen for b's loop
    assert gc.get_freeze_count() == 0  # and unfrozen once both ended
