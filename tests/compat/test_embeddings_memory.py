"""The pooler's K/V go to free blocks of the engine's own KV cache (borrowed for the forward and
given back), so embeddings need no memory beyond the GPU memory profile: batches stay within the
profiled step's tokens and sequences; a full cache falls back to a scratch cache, with a warning."""

from __future__ import annotations

import logging

import pytest

from folio import LLM
from folio.pooling_params import PoolerConfig
from folio.worker.pooler import Pooler

PROMPTS = [list(range(5, 5 + n)) for n in (3, 17, 40, 1, 9, 33)]


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(model=tiny_model, dtype="float32", device="cpu", max_model_len=128, max_num_seqs=4,
               max_num_batched_tokens=64, num_gpu_blocks_override=64, enable_prefix_caching=False)


def _scratch_embeddings(engine, prompts) -> list[list[float]]:
    """What a pooler with a cache of its own computes (no engine blocks borrowed)."""
    from folio.worker.pooler import pooler_for_runner

    pooler = pooler_for_runner(engine.runner)
    assert pooler.block_pool is None
    return pooler.embed(prompts, PoolerConfig())


def test_pooler_borrows_engine_blocks_and_gives_them_back(llm, monkeypatch):
    engine = llm.llm_engine
    pool = engine.scheduler.kv_cache_manager.block_pool
    free_before = pool.num_free_blocks
    lent, batches = [], []
    allocate, forward = pool.allocate, Pooler._forward

    def spy_allocate(n):
        lent.append(n)
        return allocate(n)

    def spy_forward(self, input_ids, positions, metadata):
        batches.append((metadata.num_seqs, int(input_ids.shape[0])))
        assert pool.num_free_blocks == free_before - lent[-1]  # the blocks are the engine's, taken
        return forward(self, input_ids, positions, metadata)

    monkeypatch.setattr(pool, "allocate", spy_allocate)
    monkeypatch.setattr(Pooler, "_forward", spy_forward)
    monkeypatch.setattr(Pooler, "_forward_over_scratch", lambda *a: pytest.fail("a scratch cache was made"))
    vectors = engine.embed(PROMPTS, PoolerConfig())
    assert pool.num_free_blocks == free_before
    # Batches within the profiled step: at most max_num_seqs prompts and max_num_batched_tokens tokens.
    assert all(seqs <= 4 and tokens <= 64 for seqs, tokens in batches)
    assert sum(seqs for seqs, _ in batches) == len(PROMPTS)
    assert sum(lent) == sum(-(-len(p) // 16) for p in PROMPTS)
    monkeypatch.undo()
    assert vectors == _scratch_embeddings(engine, PROMPTS)


def test_a_full_cache_falls_back_to_scratch_with_a_warning(llm, caplog):
    engine = llm.llm_engine
    pool = engine.scheduler.kv_cache_manager.block_pool
    taken = pool.allocate(pool.num_free_blocks - 1)  # one block left: too few for a 17-token prompt
    try:
        with caplog.at_level(logging.WARNING, logger="folio.worker.pooler"):
            vectors = engine.embed(PROMPTS[:2], PoolerConfig())
    finally:
        pool.free(taken)
    assert "scratch KV cache" in caplog.text and "1 free blocks" in caplog.text
    for got, want in zip(vectors, _scratch_embeddings(engine, PROMPTS[:2]), strict=True):
        assert got == pytest.approx(want, abs=1e-5)  # batched differently: float rounding only
