"""Speculative decoding beside structured outputs: grammar requests get no drafts yet share the
batch (and the prefix cache) with requests that do. Their outputs still validate, the drafting
requests' greedy tokens are those without speculation, and a drafting request that reuses a
structured output's cached prompt blocks still finds the draft model's K/V there."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from folio import LLM, SamplingParams, StructuredOutputsParams
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "yy"]}},
          "required": ["a", "b"], "additionalProperties": False}
REGEX = r"(ab|cd){2,4}x"
CHOICES = ["yes", "no way", "maybe"]
PROMPT = {"prompt_token_ids": list(range(100, 164))}  # 4 full blocks of 16 for the prefix cache


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama")


def _llm(path: str, speculate: bool = True) -> LLM:
    spec = {"model": path, "num_speculative_tokens": 3} if speculate else None  # draft = target
    return LLM(model=path, dtype="float32", device="cpu", seed=0, max_model_len=128, speculative_config=spec,
               enable_prefix_caching=True)


def _structured(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(**kwargs))


def test_grammars_validate_beside_drafting_requests(path):
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    params = [_structured(json=SCHEMA, disable_any_whitespace=True), _structured(regex=REGEX),
              _structured(choice=CHOICES), greedy, greedy]
    prompts = ["Hello, my name is", "a b c a b c", "The capital of France is", "a b c a b c a b c a b",
               {"prompt_token_ids": [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]}]
    llm = _llm(path)
    got = llm.generate(prompts, params, use_tqdm=False)
    jsonschema.validate(json.loads(got[0].outputs[0].text), SCHEMA)
    assert re.fullmatch(REGEX, got[1].outputs[0].text)
    assert got[2].outputs[0].text in CHOICES
    want = _llm(path, speculate=False).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert llm.llm_engine.scheduler.spec_stats.num_accepted_tokens > 0


def test_a_prefix_cached_by_a_structured_output_keeps_the_drafts_good(path):
    """The grammar request runs alone, so no request of its steps drafts; the draft model must
    still write its K/V of the prompt, which the next request takes from the prefix cache. It
    did not: the draft then read garbage there and nearly every draft was rejected."""
    llm = _llm(path)
    [first] = llm.generate([PROMPT], _structured(regex="[a-z]{5}"), use_tqdm=False)
    assert re.fullmatch("[a-z]{5}", first.outputs[0].text)
    stats = llm.llm_engine.scheduler.spec_stats
    assert stats.num_draft_tokens == 0
    [second] = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert second.num_cached_tokens == 48
    assert stats.num_draft_tokens > 0
    assert stats.acceptance_rate > 0.9  # the draft is the target: every draft holds
