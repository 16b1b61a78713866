"""Speculative decoding on a GPU: the Triton attention kernels, CUDA graphs for decode and verify
steps and for the draft's own steps, float32 so that the verify step's multi-token
attention and the decode kernel agree to the last argmax. Greedy outputs must equal the engine
without speculation; the draft = target pair must accept nearly every draft."""

from __future__ import annotations

import pytest
import torch

from folio import LLM, SamplingParams
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = ["Hello, my name is", "a b c a b c a b c a b", "The capital of France is", "1 2 3 4 1 2 3 4 1 2"]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    out = {}
    for kind in ("llama", "qwen3"):
        out[kind] = str(tmp_path_factory.mktemp(kind))
        make_tiny_checkpoint(kind, out[kind])
        save_test_tokenizer(out[kind])
    return out


def _llm(paths, spec=None, **kwargs) -> LLM:
    kwargs = {"num_gpu_blocks_override": 256, "max_model_len": 256, **kwargs}  # the preempting runs pass fewer blocks
    return LLM(model=paths["llama"], dtype="float32", device="cuda", speculative_config=spec, **kwargs)


@pytest.mark.parametrize("spec_kind", ["ngram", "draft-other", "draft-same"])
@pytest.mark.parametrize("small", [False, True], ids=["roomy", "preempting"])
def test_greedy_outputs_unchanged_on_gpu(paths, spec_kind, small):
    spec = (
        {"method": "ngram", "num_speculative_tokens": 4}
        if spec_kind == "ngram"
        else {"model": paths["qwen3" if spec_kind == "draft-other" else "llama"], "num_speculative_tokens": 4}
    )
    # 24 blocks of 8 (192 tokens) hold one request of max_model_len 128 but not the four of ~60 tokens.
    kwargs = dict(num_gpu_blocks_override=24, block_size=8, max_num_batched_tokens=32, max_model_len=128) if small else {}
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = _llm(paths, **kwargs).generate(PROMPTS, params, use_tqdm=False)
    llm = _llm(paths, spec, **kwargs)
    got = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    (alone,) = llm.generate(PROMPTS[:1], params, use_tqdm=False)  # batch 1: the smallest graphs
    assert alone.outputs[0].token_ids == want[0].outputs[0].token_ids
    if spec_kind != "ngram":  # the draft's own steps and its pass over the target's batch replay graphs
        proposer = llm.llm_engine.runner.speculator.proposer
        assert proposer.steps.graphs and proposer.mirror is not None and proposer.mirror.graphs
    stats = llm.llm_engine.scheduler.spec_stats
    assert stats.num_draft_tokens > 0
    if spec_kind == "draft-same":
        assert stats.acceptance_rate > 0.9
    if small:
        assert llm.llm_engine.stats().num_preemptions > 0
