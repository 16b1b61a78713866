"""Tensor parallelism on 2 GPUs (NCCL, CUDA graphs capturing the all-reduce): greedy tokens at
tp=2 equal tp=1 in float32 on the tiny checkpoints, and the workers exit cleanly."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from tests.parallel.test_tensor_parallel import CHECKPOINTS, PROMPTS
from tests.helpers.checkpoints import make_tiny_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]


@pytest.mark.parametrize("kind", list(CHECKPOINTS))
def test_tp2_on_two_gpus_matches_tp1(kind: str, tmp_path) -> None:
    from folio import LLM, SamplingParams

    path = make_tiny_checkpoint(kind, tmp_path / kind, **CHECKPOINTS[kind])
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got = {}
    for tp in (1, 2):
        llm = LLM(model=path, dtype="float32", tensor_parallel_size=tp, max_model_len=256, max_num_seqs=8)
        got[tp] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS * 3, params, use_tqdm=False)]
        llm.llm_engine.shutdown()
        del llm
        torch.cuda.empty_cache()
    assert got[2] == got[1]
    assert not multiprocessing.active_children()


def test_tp2_prompts_alone_replay_chunk_graphs_on_both_ranks(tmp_path, monkeypatch) -> None:
    """Each prompt alone is one request's chunk: rank 0 replays a chunk graph and names it in the
    plan, the follower replays its own; greedy tokens equal tp=1's."""
    from folio import LLM, SamplingParams
    from folio.worker.cuda_graphs import CudaGraphRunner

    replays = []
    replay = CudaGraphRunner.replay_chunk
    monkeypatch.setattr(CudaGraphRunner, "replay_chunk", lambda self, size: (replays.append(size), replay(self, size))[1])
    path = make_tiny_checkpoint("llama", tmp_path / "llama", **CHECKPOINTS["llama"])
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = {}
    for tp in (1, 2):
        llm = LLM(model=path, dtype="float32", tensor_parallel_size=tp, max_model_len=256, max_num_seqs=4,
                  enable_prefix_caching=False)
        got[tp] = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
        llm.llm_engine.shutdown()
        del llm
        torch.cuda.empty_cache()
    assert got[2] == got[1]
    assert sorted(replays) == [(16, 0), (16, 0), (64, 0), (64, 0)], replays  # 5 and 57 tokens, tp=1 and rank 0
    assert not multiprocessing.active_children()
