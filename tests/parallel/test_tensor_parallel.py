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
    env_before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
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
        assert (ref_lp is None) == (lp is None) and (ref_plp is None) == (plp is None)
        assert len(ref_lp or []) == len(lp or []) and len(ref_plp or []) == len(plp or [])
        # Log-probs and prompt log-probs close, same top tokens (a prompt's first entry is None).
        for ref_step, step in zip((ref_lp or []) + (ref_plp or [])[1:], (lp or []) + (plp or [])[1:]):
            assert ref_step.keys() == step.keys()
            assert all(abs(ref_step[t].logprob - step[t].logprob) < 1e-4 for t in step)
    assert all(p.exitcode == 0 for p in workers), [p.exitcode for p in workers]
    assert not multiprocessing.active_children()
    # the group's torchrun variables are gone with it (a later engine or child took its port)
    assert {k: os.environ.get(k) for k in env_before} == env_before


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



@pytest.fixture(scope="module")
def llama_tp(tmp_path_factory) -> tuple[list[tuple], LLM]:
    """tp=1's greedy results on the tiny Llama, and a tp=2 engine on it (shut down after)."""
    path = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    reference = _run(_llm(path, 1))
    llm = _llm(path, 2)
    yield reference, llm
    llm.llm_engine.shutdown()
    assert not multiprocessing.active_children()


@pytest.mark.timeout(60, method="thread")  # the bug hung; fail instead of waiting out the suite's limit
def test_embed_with_tp2_is_refused_and_the_engine_still_generates(llama_tp) -> None:
    # The pooler's forward sends the followers no plan: it used to wait forever in the
    # first all-reduce (the follower sat in its plan broadcast).
    reference, llm = llama_tp
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        llm.embed([{"prompt_token_ids": [1, 5, 9]}])
    assert [ids for ids, _, _ in _run(llm)] == [ids for ids, _, _ in reference]


@pytest.mark.timeout(60, method="thread")  # the bug hung; fail instead of waiting out the suite's limit
@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])  # a bad processor; Ctrl-C in one
def test_a_raising_logits_processor_fails_the_call_and_the_engine_goes_on(llama_tp, error) -> None:
    # Rank 0 raised in the sampler before the prompt log-probs' LM-head gather the step's plan
    # announced; the follower waited in that gather and the next generate hung.
    reference, llm = llama_tp

    def bad(output_ids, logits):
        if error is KeyboardInterrupt:
            raise KeyboardInterrupt
        return logits[:3]

    params = [SamplingParams(max_tokens=3, logits_processors=[bad]),
              SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1)]
    with pytest.raises(error):
        llm.generate(PROMPTS, params, use_tqdm=False)
    for request_id in list(llm.llm_engine.output_processor.requests):
        llm.llm_engine.abort_request(request_id)
    assert [ids for ids, _, _ in _run(llm)] == [ids for ids, _, _ in reference]


@pytest.mark.timeout(60, method="thread")
def test_padded_prompt_chunks_reach_the_follower_as_rank_0_runs_them(llama_tp, monkeypatch) -> None:
    # A chunk graph's step is padded past its tokens and names the graph in the plan; the
    # follower must run the same padded step (here eagerly: the CPU has no graphs), or the
    # all-reduces would pair different shapes.
    from folio.worker.chunk_graphs import chunk_step_shape
    from folio.worker.model_runner import ModelRunner

    reference, llm = llama_tp
    taken = []

    def bucket(self, so):
        shape = chunk_step_shape(so)
        if shape is None:
            return None
        taken.append(shape[0])
        return shape[0] + 13, shape[1] + 2  # padded tokens and an empty sequence or two

    monkeypatch.setattr(ModelRunner, "_chunk_bucket", bucket)
    params = SamplingParams(temperature=0, max_tokens=6)
    for prompt, (ids, _, _) in zip(PROMPTS, reference):
        assert llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == ids
    # One padded chunk a prompt (the long one's blocks may be cached by earlier tests: its rest).
    assert len(taken) == len(PROMPTS) and all(t <= len(p["prompt_token_ids"]) for t, p in zip(taken, PROMPTS))


def test_a_worker_that_dies_before_joining_fails_the_start_at_once(tmp_path) -> None:
    """A script without an `if __name__ == "__main__":` guard: the spawned worker re-runs it on
    import and dies before it joins the group. Rank 0 used to wait out the 600 s start-up
    timeout; it now raises the worker's death within seconds."""
    import subprocess
    import sys

    path = make_tiny_checkpoint("llama", tmp_path / "llama")
    script = tmp_path / "unguarded.py"
    script.write_text("from folio import LLM\n"
                      f"LLM(model={str(path)!r}, dtype='float32', device='cpu', tensor_parallel_size=2, "
                      "max_model_len=64, num_gpu_blocks_override=8)\n")
    # a fresh process, as from a shell: none of the torchrun variables a live engine here has set
    torchrun = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in torchrun}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "WorkerDiedError" in done.stderr and "rank 1" in done.stderr, done.stderr[-2000:]
    assert elapsed < 120, elapsed
