"""Requests refused for their inputs end as ValueErrors naming the field, before anything runs,
and leave the engine as a fresh one: its next good request gives a fresh engine's output.

Found by a review: each case here failed mid-step (IndexError, OverflowError, TypeError), ran
with a value no check saw, or loaded an adapter for a request then refused."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from folio.lora.request import LoRARequest
from folio.sampling_params import BeamSearchParams, SamplingParamsError
from tests.helpers.checkpoints import make_tiny_checkpoint, tiny_model_dir
from tests.prefix.helpers import make_llm

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama")


@pytest.fixture(scope="module")
def llm(path) -> LLM:
    return make_llm(path, seed=0)


@pytest.fixture(scope="module")
def fresh_output(path) -> list[int]:
    return _greedy(make_llm(path, seed=0))


def _greedy(llm: LLM, prompt: str | dict = PROMPT) -> list[int]:
    return list(llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids)


def _assert_as_fresh(llm: LLM, fresh_output: list[int]) -> None:
    assert not llm.llm_engine.has_unfinished_requests()
    assert _greedy(llm) == fresh_output


def test_text_with_ids_beyond_the_model_is_refused_before_it_runs(path, tmp_path):
    # A tokenizer larger than the model: IndexError from torch.embedding, mid-step.
    small = make_tiny_checkpoint("llama", tmp_path / "small", vocab_size=300)
    llm = make_llm(small, tokenizer=path)
    text = "Paris is the capital of France, said the zebra."
    high = max(llm.get_tokenizer().encode(text))
    assert high >= 300
    for prompt in (text, {"prompt": text}):
        with pytest.raises(SamplingParamsError, match=f"token id {high}, outside the model's vocabulary") as err:
            llm.generate(prompt, GREEDY, use_tqdm=False)
        assert err.value.param == "prompt"
    good = {"prompt_token_ids": [5, 17, 250, 299]}
    assert _greedy(llm, good) == _greedy(make_llm(small, tokenizer=path), good)


def test_the_largest_seed_takes_several_samples(llm, fresh_output):
    # seed + 1 overflowed torch.Generator.manual_seed and failed the whole batch.
    def samples(seed: int, n: int) -> list[list[int]]:
        params = SamplingParams(seed=seed, n=n, temperature=1.0, max_tokens=5, ignore_eos=True)
        return [list(c.token_ids) for c in llm.generate(PROMPT, params, use_tqdm=False)[0].outputs]

    both = samples(2**64 - 1, 2)
    assert both == [samples(2**64 - 1, 1)[0], samples(0, 1)[0]]  # sample 1's seed wraps to 0
    _assert_as_fresh(llm, fresh_output)


def test_params_changed_after_construction_are_checked(llm, fresh_output):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=4, ignore_eos=True)
    params.n = 3  # was one completion: best_of stayed 1
    assert len(llm.generate(PROMPT, params, use_tqdm=False)[0].outputs) == 3
    for field, value in [("temperature", float("nan")), ("max_tokens", "3"), ("top_k", 2.5)]:
        bad = SamplingParams()
        setattr(bad, field, value)
        with pytest.raises(SamplingParamsError) as err:
            llm.generate([PROMPT, "Hello"], bad, use_tqdm=False)
        assert err.value.param == field
    _assert_as_fresh(llm, fresh_output)


def test_wrong_argument_types_are_clear_errors(llm, fresh_output):
    conversation = [{"role": "user", "content": "hi"}]
    cases = [
        (lambda: llm.generate(PROMPT, GREEDY, lora_request="adapter", use_tqdm=False),
         "lora_request must be a LoRARequest or a list of them, got str"),
        (lambda: llm.embed(["a"], [None], use_tqdm=False), "pooling_params entries must be PoolingParams"),
        (lambda: llm.chat(conversation, GREEDY, chat_template_kwargs=[1], use_tqdm=False), "chat_template_kwargs"),
        (lambda: llm.chat(conversation, GREEDY, chat_template_kwargs="x", use_tqdm=False), "chat_template_kwargs"),
        (lambda: llm.chat(conversation, GREEDY, chat_template=5, use_tqdm=False), "chat_template must be"),
        (lambda: llm.chat(conversation, GREEDY, add_generation_prompt="no", use_tqdm=False), "add_generation_prompt"),
        (lambda: llm.chat(conversation, GREEDY, continue_final_message="no", use_tqdm=False), "continue_final_message"),
        (lambda: llm.chat(conversation, GREEDY, chat_template="{% for i in range(10**9) %}{% endfor %}",
                          use_tqdm=False), "failed to render"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    _assert_as_fresh(llm, fresh_output)


def test_an_adapter_is_not_loaded_for_a_refused_request(path, tmp_path):
    # add_lora ran before the params were checked: a refused request could push an adapter in
    # use out of the CPU cache (max_cpu_loras=1).
    from tests.helpers.adapters import make_peft_adapter

    one = make_peft_adapter(path, tmp_path / "one", seed=1, r=4, target_modules=["q_proj"])
    two = make_peft_adapter(path, tmp_path / "two", seed=2, r=4, target_modules=["q_proj"])
    kwargs = dict(enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=4)
    llm = make_llm(path, **kwargs)
    adapter_one = LoRARequest("one", 1, one)
    first = list(llm.generate(PROMPT, GREEDY, lora_request=adapter_one, use_tqdm=False)[0].outputs[0].token_ids)
    engine = llm.llm_engine
    refused = [(SamplingParams(logprobs=50), "max_logprobs"), (BeamSearchParams(beam_width=30, max_tokens=3), "beam_width")]
    for params, message in refused:
        with pytest.raises(ValueError, match=message):
            engine.add_request("bad", PROMPT, params, lora_request=LoRARequest("two", 2, two))
        assert engine.list_loras() == {1}
    again = llm.generate(PROMPT, GREEDY, lora_request=adapter_one, use_tqdm=False)[0].outputs[0].token_ids
    assert list(again) == first
    fresh = make_llm(path, **kwargs).generate(PROMPT, GREEDY, lora_request=adapter_one, use_tqdm=False)
    assert list(fresh[0].outputs[0].token_ids) == first
