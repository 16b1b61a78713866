"""Speculative decoding with LoRA adapters: the target verifies with each request's adapter (the
draft model and n-gram know nothing of adapters), so greedy tokens are PEFT's under each adapter
and the base model's without one, in one batch that mixes them, with the prefix cache on and a
cache small enough to preempt. Structured outputs beside them still validate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from folio import LLM, SamplingParams, StructuredOutputsParams
from folio.lora.request import LoRARequest
from tests.helpers.adapters import make_peft_adapter, peft_greedy
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow

MAX_NEW = 12
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [40, 41, 42, 43, 40, 41, 42], [900, 3, 17, 250, 3, 17]]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    base = tiny_model_dir(tmp_path_factory, "llama")
    adapter = make_peft_adapter(base, tmp_path_factory.mktemp("adapter"), seed=1, r=4, lora_alpha=8)
    refs = {"base": peft_greedy(base, None, PROMPTS, MAX_NEW), "lora": peft_greedy(base, adapter, PROMPTS, MAX_NEW)}
    assert refs["base"] != refs["lora"]
    return base, LoRARequest("a", 1, adapter), refs


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_mixed_adapters_under_speculation_match_peft(case, method):
    base, adapter, refs = case
    spec = ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
            if method == "ngram" else {"model": base, "num_speculative_tokens": 3})
    llm = LLM(model=base, dtype="float32", device="cpu", seed=0, max_model_len=48, enable_lora=True, max_lora_rank=8,
              speculative_config=spec, enable_prefix_caching=True, block_size=4, num_gpu_blocks_override=20)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS] * 2
    loras = [adapter] * len(PROMPTS) + [None] * len(PROMPTS)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    structured = SamplingParams(temperature=0, max_tokens=30,
                                structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
    outputs = llm.generate(prompts + prompts[:2], [greedy] * len(prompts) + [structured] * 2, use_tqdm=False,
                           lora_request=loras + [adapter, None])
    assert [o.outputs[0].token_ids for o in outputs[: len(prompts)]] == refs["lora"] + refs["base"]
    for o in outputs[len(prompts):]:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    engine = llm.llm_engine
    assert engine.scheduler.spec_stats.num_draft_tokens > 0
    assert engine.stats().num_preemptions > 0
