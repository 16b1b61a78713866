"""Requests are refused before their adapter loads. Found by a review: LLM.beam_search refused a
prompt that leaves no room to generate (exactly max_model_len tokens) in engine/beam_search.py,
after add_request had loaded the adapter, which could push an adapter in use out of the CPU
cache; generate() loaded prompt 0's adapter before refusing a bad prompt 1."""

from __future__ import annotations

import pytest

from folio import LLM
from folio.lora.request import LoRARequest
from folio.sampling_params import BeamSearchParams, SamplingParamsError
from tests.helpers.adapters import make_peft_adapter
from tests.helpers.checkpoints import tiny_model_dir
from tests.prefix.helpers import greedy, make_llm

pytestmark = pytest.mark.slow

MAX_LEN = 32
PARAMS = BeamSearchParams(beam_width=2, max_tokens=3)
LORA_KWARGS = dict(enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=4, max_model_len=MAX_LEN)


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama", "beam-room-llama")


@pytest.fixture(scope="module")
def adapters(path, tmp_path_factory) -> tuple[LoRARequest, LoRARequest]:
    folder = tmp_path_factory.mktemp("beam-room-adapters")
    one = make_peft_adapter(path, folder / "one", seed=1, r=4, target_modules=["q_proj"])
    two = make_peft_adapter(path, folder / "two", seed=2, r=4, target_modules=["q_proj"])
    return LoRARequest("one", 1, one), LoRARequest("two", 2, two)


def _tokens(n: int) -> dict:
    return {"prompt_token_ids": [5 + i for i in range(n)]}


def _beams(llm: LLM, prompt, lora: LoRARequest | None) -> list[list[int]]:
    (out,) = llm.beam_search(prompt, PARAMS, lora_request=lora)
    return [list(s.tokens) for s in out.sequences]


def test_a_full_context_prompt_is_refused_before_its_adapter_loads(path, adapters):
    one, two = adapters
    llm = make_llm(path, **LORA_KWARGS)
    before = _beams(llm, _tokens(MAX_LEN - 1), one)  # one token of room: searched, with adapter one
    engine = llm.llm_engine
    text = " ".join(["word"] * 40)
    assert len(llm.get_tokenizer().encode(text)) > MAX_LEN
    refusals = [
        [_tokens(MAX_LEN)],  # exactly max_model_len: no room for one new token
        [_tokens(4), _tokens(MAX_LEN)],  # a good prompt first: its adapter must not load either
        [_tokens(4), text],  # longer than the context, as text
    ]
    for prompts in refusals:
        with pytest.raises(ValueError, match="tokens long") as err:
            llm.beam_search(prompts, PARAMS, lora_request=two)
        assert engine.list_loras() == {1}  # adapter two never loaded: adapter one stays cached
        assert not engine.has_unfinished_requests()
        assert isinstance(err.value, SamplingParamsError) and err.value.param == "prompt"
    with pytest.raises(SamplingParamsError, match="no room to generate within max_model_len=32"):
        llm.beam_search(_tokens(MAX_LEN), PARAMS)
    assert _beams(llm, _tokens(MAX_LEN - 1), one) == before
    assert _beams(make_llm(path, **LORA_KWARGS), _tokens(MAX_LEN - 1), one) == before  # as a fresh engine's


def test_text_prompts_search_as_before(path):
    llm = make_llm(path, max_model_len=MAX_LEN)
    prompt = "The capital of France is"
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True))
    ids = llm.get_tokenizer().encode(prompt)
    assert all(list(s.tokens[: len(ids)]) == ids for s in out.sequences)
    # beam width 1 is greedy search
    (one,) = llm.beam_search(prompt, BeamSearchParams(beam_width=1, max_tokens=4, ignore_eos=True))
    (want,) = llm.generate(prompt, greedy(4), use_tqdm=False)
    assert list(one.sequences[0].tokens[len(ids):]) == list(want.outputs[0].token_ids)


def test_the_engine_refuses_it_before_loading_the_adapter(path, adapters):
    """The server's use_beam_search path calls LLMEngine.add_request directly."""
    one, two = adapters
    llm = make_llm(path, **LORA_KWARGS)
    engine = llm.llm_engine
    engine.add_request("ok", _tokens(4), PARAMS, lora_request=one)
    while engine.has_unfinished_requests():
        engine.step()
    with pytest.raises(SamplingParamsError, match="no room to generate") as err:
        engine.add_request("full", _tokens(MAX_LEN), PARAMS, lora_request=two)
    assert err.value.param == "prompt"
    assert engine.list_loras() == {1} and not engine.has_unfinished_requests()


@pytest.mark.parametrize("bad", ["too long", "bad grammar", "bad params"])
def test_generate_checks_every_prompt_before_any_adapter_loads(path, adapters, bad):
    from folio import SamplingParams
    from folio.sampling_params import StructuredOutputsParams

    one, two = adapters
    llm = make_llm(path, **LORA_KWARGS)
    llm.generate(_tokens(4), greedy(2), lora_request=one, use_tqdm=False)
    engine = llm.llm_engine
    good = greedy(2)
    second = {"too long": (_tokens(MAX_LEN + 1), good),
              "bad grammar": (_tokens(4), SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(
                  json={"type": "object", "properties": {"a": {"$ref": "http://example.com/x"}}}))),
              "bad params": (_tokens(4), SamplingParams(max_tokens=2, stop_token_ids=[10**6]))}[bad]
    with pytest.raises(ValueError):
        llm.generate([_tokens(4), second[0]], [good, second[1]], lora_request=two, use_tqdm=False)
    assert engine.list_loras() == {1} and not engine.has_unfinished_requests()
    (out,) = llm.generate(_tokens(4), greedy(2), lora_request=two, use_tqdm=False)  # a good batch still runs
    assert len(out.outputs[0].token_ids) == 2 and engine.list_loras() == {2}
