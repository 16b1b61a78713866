"""Greedy tokens from folio equal transformers' generate, for every architecture, in float32.

Each prompt alone, all prompts batched, batched with a small token budget (chunked prefill
mixed with decodes), and batched with a KV cache so small that requests are preempted.
"""

from __future__ import annotations

import random

import pytest
import torch

from folio import LLM, SamplingParams
from tests.helpers.checkpoints import tiny_model_dir
from tests.helpers.reference import hf_greedy_with_logprobs

KINDS = ["llama", "llama3", "mistral", "qwen2", "qwen3", "opt"]
PROMPT_LENGTHS = [1, 2, 7, 16, 17, 40, 64, 101, 130]
MAX_NEW = 20
NUM_LOGPROBS = 5

pytestmark = pytest.mark.slow


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=KINDS)
def case(request, tmp_path_factory):
    """A tiny checkpoint with a tokenizer, plus transformers' greedy reference for each prompt."""
    path = tiny_model_dir(tmp_path_factory, request.param)
    prompts = _prompts(KINDS.index(request.param))
    return path, prompts, hf_greedy_with_logprobs(path, prompts, MAX_NEW)


def _greedy(logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=logprobs)


def _token_prompts(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def _make_llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    return LLM(model=path, dtype="float32", device="cpu", **kwargs)


def test_each_prompt_alone(case):
    path, prompts, refs = case
    llm = _make_llm(path)
    for prompt, (ref_tokens, _) in zip(prompts, refs):
        (out,) = llm.generate(_token_prompts([prompt]), _greedy(), use_tqdm=False)
        assert out.outputs[0].token_ids == ref_tokens


def test_all_batched_with_logprobs(case):
    path, prompts, refs = case
    llm = _make_llm(path)
    outs = llm.generate(_token_prompts(prompts), _greedy(NUM_LOGPROBS), use_tqdm=False)
    for out, (ref_tokens, ref_logprobs) in zip(outs, refs):
        completion = out.outputs[0]
        assert completion.token_ids == ref_tokens
        assert len(completion.logprobs) == MAX_NEW
        for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            assert token in entry
            assert entry[token].logprob == pytest.approx(ref_logprobs[step, token].item(), abs=1e-3)
            top = torch.topk(ref_logprobs[step], NUM_LOGPROBS)
            for value, tok in zip(top.values.tolist(), top.indices.tolist()):
                if tok in entry:
                    assert entry[tok].logprob == pytest.approx(value, abs=1e-3)
        expected_cum = sum(ref_logprobs[s, t].item() for s, t in enumerate(ref_tokens))
        assert completion.cumulative_logprob == pytest.approx(expected_cum, abs=1e-2)


def test_chunked_prefill_mixed_with_decodes(case):
    path, prompts, refs = case
    llm = _make_llm(path, max_num_batched_tokens=24, max_num_seqs=4)
    outs = llm.generate(_token_prompts(prompts), _greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [r[0] for r in refs]


def test_preempted_requests_resume_identically(case):
    path, prompts, refs = case
    # 12 blocks of 16 tokens: one request of 130 + 20 tokens fits, all of them together do not.
    llm = _make_llm(path, num_gpu_blocks_override=12, max_model_len=192)
    outs = llm.generate(_token_prompts(prompts), _greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [r[0] for r in refs]
    stats = llm.llm_engine.stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == stats.num_blocks  # nothing leaked
