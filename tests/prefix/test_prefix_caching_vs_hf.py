"""Greedy tokens with prefix caching equal those without it and transformers' generate, for
prompts sharing 0, 1, many and all blocks with earlier ones, in one batch or one by one, after
eviction, and under preemption; the cache's hits are counted where the server reads them."""

from __future__ import annotations

import random

import pytest

from tests.prefix.helpers import greedy, hf_greedy, make_llm, token_prompts

pytestmark = pytest.mark.slow

MAX_NEW = 12
BS = 16


def _prompts() -> tuple[list[list[int]], list[int]]:
    rng = random.Random(5)
    system = [rng.randrange(3, 1000) for _ in range(3 * BS)]  # exactly 3 blocks
    tail = lambda n: [rng.randrange(3, 1000) for _ in range(n)]  # noqa: E731
    prompts = [
        list(system),  # computes the 3 blocks
        tail(40),  # shares 0 blocks
        system[:BS] + tail(21),  # shares 1 block
        system[: 3 * BS] + tail(9),  # shares 3 blocks (many)
        list(system),  # shares all 3: the last block is recomputed for its logits
        system[: 2 * BS + 5],  # 2 full blocks shared, ends mid-block
    ]
    expected_cached = [0, 0, BS, 3 * BS, 2 * BS, 2 * BS]
    return prompts, expected_cached


@pytest.fixture(scope="module", params=["llama", "mistral"])  # mistral: a sliding window
def case(request, checkpoint):
    path = checkpoint(request.param)
    prompts, cached = _prompts()
    return path, prompts, cached, hf_greedy(path, prompts, MAX_NEW)


def test_one_by_one_hits_the_blocks_earlier_prompts_left(case):
    path, prompts, cached, refs = case
    llm = make_llm(path)
    outs = [llm.generate(token_prompts([p]), greedy(MAX_NEW), use_tqdm=False)[0] for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == refs
    assert [o.num_cached_tokens for o in outs] == cached
    stats = llm.llm_engine.stats()
    assert stats.prefix_cache_hits == sum(cached)
    assert stats.prefix_cache_queries == sum(len(p) for p in prompts)
    assert stats.prefix_cache_hit_rate == pytest.approx(sum(cached) / sum(len(p) for p in prompts))
    assert stats.num_computed_prompt_tokens == sum(len(p) for p in prompts) - sum(cached)
    assert stats.num_free_blocks == stats.num_blocks


def test_one_batch_shares_blocks_computed_in_the_same_step(case):
    path, prompts, _, refs = case
    llm = make_llm(path)
    outs = llm.generate(token_prompts(prompts), greedy(MAX_NEW), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    # All arrive together: the later ones hit the system prompt's blocks that the first one
    # computes in the very same step.
    assert [o.num_cached_tokens for o in outs][2:] == [BS, 3 * BS, 2 * BS, 2 * BS]


def test_caching_off_computes_everything_and_gives_the_same_tokens(case):
    path, prompts, _, refs = case
    llm = make_llm(path, enable_prefix_caching=False)
    outs = [llm.generate(token_prompts([p]), greedy(MAX_NEW), use_tqdm=False)[0] for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == refs
    assert all(o.num_cached_tokens == 0 for o in outs)
    stats = llm.llm_engine.stats()
    assert stats.prefix_cache_queries == 0 and stats.num_cached_blocks == 0
    assert stats.num_computed_prompt_tokens == sum(len(p) for p in prompts)


def test_after_eviction_the_prefix_is_recomputed_correctly(case):
    path, prompts, _, refs = case
    # 16 blocks: filler requests of 200 tokens need 13 each and evict everything cached.
    llm = make_llm(path, num_gpu_blocks_override=16)
    (first,) = llm.generate(token_prompts([prompts[3]]), greedy(MAX_NEW), use_tqdm=False)
    rng = random.Random(9)
    fillers = [[rng.randrange(3, 1000) for _ in range(200)] for _ in range(2)]
    llm.generate(token_prompts(fillers), greedy(4), use_tqdm=False)
    assert llm.llm_engine.stats().num_evicted_blocks > 0
    (again,) = llm.generate(token_prompts([prompts[3]]), greedy(MAX_NEW), use_tqdm=False)
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == refs[3]
    assert again.num_cached_tokens == 0  # its blocks were evicted


def test_preempted_requests_resume_through_the_cache(case):
    path, prompts, _, refs = case
    # 8 blocks of 16 tokens: two or three prompts fit at once, not all six.
    llm = make_llm(path, num_gpu_blocks_override=8, max_model_len=128)
    outs = llm.generate(token_prompts(prompts), greedy(MAX_NEW), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    stats = llm.llm_engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.num_free_blocks == stats.num_blocks


def test_a_cache_salt_shares_blocks_only_with_the_same_salt(case):
    """vLLM's `cache_salt` prompt key: the same prompt under another salt (or none) computes
    everything; under the same salt it hits; the tokens never change."""
    path, prompts, _, refs = case
    llm = make_llm(path)
    system = prompts[0]

    def run(salt: str | None):
        prompt = {"prompt_token_ids": system} | ({"cache_salt": salt} if salt else {})
        return llm.generate([prompt], greedy(MAX_NEW), use_tqdm=False)[0]

    outs = [run(None), run("tenant-a"), run("tenant-b"), run("tenant-a"), run(None)]
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0, 2 * BS, 2 * BS]
    assert all(o.outputs[0].token_ids == refs[0] for o in outs)
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate([{"prompt_token_ids": system, "cache_salt": ""}], greedy(2), use_tqdm=False)
