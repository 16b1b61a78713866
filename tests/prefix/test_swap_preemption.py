"""Under a KV cache forced small, preemption by swap and by recompute give outputs identical to
an unconstrained run, and no block is left behind in the device or the CPU pool."""

from __future__ import annotations

import random

import pytest

from folio import SamplingParams
from tests.prefix.helpers import greedy, hf_greedy, make_llm, token_prompts

pytestmark = pytest.mark.slow

LENGTHS = [20, 47, 90, 33, 64, 5]
MAX_NEW = 24


@pytest.fixture(scope="module")
def case(checkpoint):
    path = checkpoint("llama")
    rng = random.Random(23)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in LENGTHS]
    return path, prompts, hf_greedy(path, prompts, MAX_NEW)


def _tight(path, mode, caching=True):
    # 9 blocks of 16 tokens: the 90 + 24 token request fits alone, the six together do not.
    return make_llm(path, num_gpu_blocks_override=9, max_model_len=144, preemption_mode=mode,
                    swap_space=0.01, enable_prefix_caching=caching)


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_greedy_outputs_survive_either_preemption_mode(case, mode, caching):
    path, prompts, refs = case
    llm = _tight(path, mode, caching)
    outs = llm.generate(token_prompts(prompts), greedy(MAX_NEW), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == refs
    stats = llm.llm_engine.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swap_preemptions == stats.num_preemptions
        assert stats.num_swapped_out_blocks > 0 and stats.num_swapped_in_blocks > 0
    else:
        assert stats.num_swap_preemptions == 0 and stats.num_swapped_out_blocks == 0
    assert stats.num_free_blocks == stats.num_blocks
    assert stats.num_free_cpu_blocks == stats.num_cpu_blocks
    assert (stats.num_cpu_blocks > 0) == (mode == "swap")  # forced recompute needs no pool


def test_seeded_sampling_survives_swap(case):
    path, prompts, _ = case
    params = SamplingParams(temperature=0.9, top_k=50, seed=77, max_tokens=MAX_NEW, ignore_eos=True)
    expected = make_llm(path).generate(token_prompts(prompts), params, use_tqdm=False)
    for mode in ("swap", "recompute"):
        llm = _tight(path, mode)
        outs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expected]
        stats = llm.llm_engine.stats()
        assert stats.num_preemptions > 0 and stats.num_free_blocks == stats.num_blocks
        assert stats.num_free_cpu_blocks == stats.num_cpu_blocks


def test_swap_mode_without_swap_space_is_refused(case):
    path, _, _ = case
    with pytest.raises(ValueError, match="swap"):
        make_llm(path, preemption_mode="swap", swap_space=0)
