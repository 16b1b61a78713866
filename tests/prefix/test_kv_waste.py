"""The engine reports KV waste: paged allocation wastes only partial last blocks, while
contiguous preallocation to max_model_len would waste most of the memory (the seeds' 60-80%)."""

from __future__ import annotations

import random

import pytest

from folio import SamplingParams
from tests.prefix.helpers import make_llm, token_prompts

pytestmark = pytest.mark.slow


def test_paged_waste_is_small_and_preallocation_waste_is_large(checkpoint):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randint(10, 120))] for _ in range(12)]
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=rng.randint(10, 120)) for _ in prompts]
    llm = make_llm(checkpoint("llama"), max_model_len=512, enable_prefix_caching=False)
    llm.generate(token_prompts(prompts), params, use_tqdm=False)
    stats = llm.llm_engine.stats()
    # At most block_size - 1 empty slots per request, against ~100+ tokens each.
    assert 0.0 < stats.kv_waste_fraction < 0.15
    assert stats.kv_waste_fraction_prealloc_max_model_len > 0.6
    assert stats.kv_waste_fraction < stats.kv_waste_fraction_prealloc_max_tokens
    assert stats.kv_waste_fraction_prealloc_max_tokens < stats.kv_waste_fraction_prealloc_max_model_len
