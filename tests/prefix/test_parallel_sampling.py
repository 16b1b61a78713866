"""n > 1 and best_of: the prompt is computed once, its blocks are shared by all samples (the
partial last block is copied on first write), seeded samples repeat, and best_of returns the
n best by cumulative log-prob."""

from __future__ import annotations

import random

import pytest

from folio import SamplingParams
from tests.prefix.helpers import greedy, hf_greedy, make_llm, token_prompts

pytestmark = pytest.mark.slow

PROMPT_LEN = 200  # 12.5 blocks of 16


@pytest.fixture(scope="module")
def path(checkpoint):
    return checkpoint("llama")


def _prompt(seed: int = 1, n: int = PROMPT_LEN) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def _peak_blocks(llm, prompt: list[int], params: SamplingParams, copies: int = 1) -> tuple[int, list]:
    """Run requests step by step; the most KV blocks in use at once, and the outputs."""
    engine = llm.llm_engine
    for i in range(copies):
        engine.add_request(f"peak{i}", {"prompt_token_ids": prompt}, params)
    peak, outputs = 0, []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.finished]
        stats = engine.stats()
        peak = max(peak, stats.num_blocks - stats.num_free_blocks)
    return peak, outputs


@pytest.mark.parametrize("caching", [True, False])
def test_n_samples_use_about_one_prompt_of_blocks(path, caching):
    n, max_tokens = 8, 6
    prompt = _prompt()
    params = SamplingParams(n=n, temperature=1.0, seed=11, max_tokens=max_tokens, ignore_eos=True)
    llm = make_llm(path, enable_prefix_caching=caching)
    peak, (out,) = _peak_blocks(llm, prompt, params)
    one_prompt = -(-PROMPT_LEN // 16)  # 13 blocks
    # 12 shared full blocks, then per sample its copy of the 13th (8 tokens + its outputs).
    assert peak <= one_prompt + n
    # n independent requests (no sharing, no cache) hold n prompts' worth.
    alone = make_llm(path, enable_prefix_caching=False)
    single = SamplingParams(temperature=1.0, seed=11, max_tokens=max_tokens, ignore_eos=True)
    peak_alone, _ = _peak_blocks(alone, prompt, single, copies=n)
    assert peak_alone >= n * one_prompt
    stats = llm.llm_engine.stats()
    assert stats.num_copied_blocks == n - 1  # the partial 13th block, once per extra sample
    assert stats.num_computed_prompt_tokens == PROMPT_LEN + (n - 1)  # + each one's last token
    assert stats.num_free_blocks == stats.num_blocks
    assert len(out.outputs) == n and len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_seeded_samples_repeat_and_match_unshared_runs(path):
    prompt = _prompt(2, 45)
    params = SamplingParams(n=4, temperature=1.0, top_p=0.95, seed=5, max_tokens=10, ignore_eos=True)
    llm = make_llm(path)
    first = llm.generate(token_prompts([prompt]), params, use_tqdm=False)[0]
    second = llm.generate(token_prompts([prompt]), params, use_tqdm=False)[0]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in second.outputs]
    # Sample i is the request with seed + i on its own: sharing changes nothing.
    plain = make_llm(path, enable_prefix_caching=False)
    for i, c in enumerate(first.outputs):
        alone = SamplingParams(temperature=1.0, top_p=0.95, seed=5 + i, max_tokens=10, ignore_eos=True)
        (o,) = plain.generate(token_prompts([prompt]), alone, use_tqdm=False)
        assert o.outputs[0].token_ids == c.token_ids


def test_greedy_samples_all_equal_transformers(path):
    prompts = [_prompt(3, 33), _prompt(4, 48), _prompt(5, 7)]
    refs = hf_greedy(path, prompts, 10)
    llm = make_llm(path)
    params = SamplingParams(n=3, temperature=0.0, max_tokens=10, ignore_eos=True)
    outs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
    for out, ref in zip(outs, refs):
        assert [c.token_ids for c in out.outputs] == [ref] * 3


def test_best_of_returns_the_n_best_by_cumulative_logprob(path):
    prompt = _prompt(6, 30)
    llm = make_llm(path)
    everything = SamplingParams(n=5, temperature=1.0, seed=21, max_tokens=8, ignore_eos=True, logprobs=0)
    (all_out,) = llm.generate(token_prompts([prompt]), everything, use_tqdm=False)
    ranked = sorted(all_out.outputs, key=lambda c: -c.cumulative_logprob)
    best = SamplingParams(n=2, best_of=5, temperature=1.0, seed=21, max_tokens=8, ignore_eos=True)
    (out,) = llm.generate(token_prompts([prompt]), best, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in ranked[:2]]
    assert out.outputs[0].cumulative_logprob >= out.outputs[1].cumulative_logprob
    assert all(c.logprobs is None for c in out.outputs)  # not asked for


def test_n_samples_under_preemption_swap_and_give_the_same_tokens(path):
    prompt = _prompt(7, 70)
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=40, ignore_eos=True)
    roomy = make_llm(path)
    (expected,) = roomy.generate(token_prompts([prompt]), params, use_tqdm=False)
    # 9 blocks: the 4 samples (5 shared prompt blocks, then 3 of their own each) do not fit.
    tight = make_llm(path, num_gpu_blocks_override=9, max_model_len=144, swap_space=0.01)
    (out,) = tight.generate(token_prompts([prompt]), params, use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in expected.outputs]
    stats = tight.llm_engine.stats()
    assert stats.num_preemptions > 0 and stats.num_swap_preemptions > 0  # a family: swapped
    assert stats.num_free_blocks == stats.num_blocks
    assert stats.num_free_cpu_blocks == stats.num_cpu_blocks
