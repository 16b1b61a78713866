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
        assert frozen == gc.get_freeze_count() > 1000
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)
        # the run did not unfreeze the owner's heap (a few frozen objects may die by refcount)
        assert counts and gc.get_freeze_count() > 0.9 * frozen
    finally:
        gc.unfreeze()
