"""Tensor parallelism on the CPU (gloo, 2 ranks): same greedy tokens as one rank, clean exits,
and a killed worker turns into an error within seconds.

Each tensor-parallel engine spawns one worker process; the checkpoints are the tiny ones of
tests/helpers/checkpoints.py, with shapes that exercise each sharding rule: Llama splits its 2
KV heads, Qwen3 with one KV head replicates it, OPT has biases and learned positions.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import signal
import threading
import time

import pytest

from folio import LLM, SamplingParams
from folio.parallel.workers import WorkerDiedError
from tests.helpers.checkpoints import make_tiny_checkpoint

PROMPTS = [
    {"prompt_token_ids": [1, 5, 9, 200, 17]},
    {"prompt_token_ids": list(range(3, 60))},  # spans several KV blocks
]
CHECKPOINTS = {
    "llama": {},  # 6 heads, 2 KV heads: one KV head per rank
    "qwen3": {"num_key_value_heads": 1},  # one KV head: replicated on both ranks
    "opt": {},  # biases everywhere (row-parallel bias added once), learned positions
}


def _llm(path: str, tp: int) -> LLM:
    return LLM(model=path, dtype="float32", device="cpu", tensor_parallel_size=tp, max_model_len=128,
               max_num_seqs=4, num_gpu_blocks_override=24, seed=0)


def _run(llm: LLM) -> list[tuple]:
    params = [SamplingParams(temperature=0, max_tokens=6, logprobs=2),
              SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=1)]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs) for o in outputs]


@pytest.mark.parametrize("kind", list(CHECKPOINTS))
def test_tp2_greedy_tokens_equal_tp1(kind: str, tmp_path) -> None:
    path = make_tiny_checkpoint(kind, tmp_path / kind, **CHECKPOINTS[kind])
    one = _llm(path, 1)
    reference = _run(one)
    llm = _llm(path, 2)
    try:
        got = _run(llm)
        # Each rank caches half of the KV heads (Qwen3's single KV head: all of it, on both).
        stats, ref_stats = llm.llm_engine.stats(), one.llm_engine.stats()
        share = 1 if CHECKPOINTS[kind].get("num_key_value_heads") == 1 else 2
        assert stats.tensor_parallel_size == 2
        assert stats.kv_cache_bytes_per_rank * share == ref_stats.kv_cache_bytes_per_rank
        workers = list(llm.llm_engine._tp.workers.processes.values())
    finally:
        llm.llm_engine.shutdown()
    for (ref_ids, ref_lp, ref_plp), (ids, lp, plp) in zip(reference, got):
        assert ids == ref_ids
        for ref_step, step in zip(ref_lp or [], lp or []):  # log-probs close, same top tokens
            assert ref_step.keys() == step.keys()
            assert all(abs(ref_step[t].logprob - step[t].logprob) < 1e-4 for t in step)
        assert (ref_plp is None) == (plp is None)
    assert all(p.exitcode == 0 for p in workers), [p.exitcode for p in workers]
    assert not multiprocessing.active_children()


def test_idle_past_the_collective_timeout_then_a_killed_worker_fails_within_seconds(tmp_path) -> None:
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.llm_engine import LLMEngine

    path = make_tiny_checkpoint("llama", tmp_path / "llama")
    args = EngineArgs(model=path, dtype="float32", device="cpu", tensor_parallel_size=2, max_model_len=128,
                      max_num_seqs=4, num_gpu_blocks_override=24)
    config = args.create_engine_config()
    config = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, collective_timeout_s=2.0))
    llm = LLM.__new__(LLM)
    llm.llm_engine = LLMEngine(config)
    llm._request_counter = itertools.count()
    try:
        first = _run(llm)
        time.sleep(3)  # the followers wait for the next plan longer than the collective timeout
        assert _run(llm) == first
        (worker,) = llm.llm_engine._tp.workers.processes.values()
        os.kill(worker.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="rank 1 .* died .*SIGKILL"):
            while time.monotonic() - start < 10:  # the watcher notices at once; bound the wait
                llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2), use_tqdm=False)
        assert time.monotonic() - start < 10
    finally:
        llm.llm_engine.shutdown()
    assert not multiprocessing.active_children()


def test_tp2_embeddings_are_refused_not_hung(tmp_path) -> None:
    """The pooler runs rank 0's model alone: its all-reduces would wait forever for the workers."""
    llm = _llm(make_tiny_checkpoint("llama", tmp_path / "llama"), 2)
    errors: list[BaseException] = []

    def embed() -> None:
        try:
            llm.embed(PROMPTS, use_tqdm=False)
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    try:
        thread = threading.Thread(target=embed, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "embed() hung with tensor_parallel_size=2"
        assert len(errors) == 1 and isinstance(errors[0], ValueError), errors
        assert "tensor_parallel_size" in str(errors[0])
        assert _run(llm)  # the engine still serves
    finally:
        if not thread.is_alive():
            llm.llm_engine.shutdown()
