"""The vLLM arguments folio honours beyond its own: skip_tokenizer_init, hf_overrides,
generation_config / override_generation_config, and vLLM's None defaults."""

from __future__ import annotations

import json
import os

import pytest

from folio import LLM, SamplingParams
from folio.engine.arg_utils import EngineArgs


def test_vllm_style_llm_call_is_accepted(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=1, trust_remote_code=True, disable_log_stats=True,
              tokenizer_mode="auto", revision="main", download_dir="/tmp", compilation_config={"level": 3},
              kv_cache_dtype="auto", seed=None, enable_prefix_caching=None, device="cpu", max_model_len=128)
    (out,) = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


def test_skip_tokenizer_init_takes_and_returns_token_ids(tiny_model):
    llm = LLM(tiny_model, skip_tokenizer_init=True, device="cpu", max_model_len=128)
    assert llm.get_tokenizer() is None
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, detokenize=False)
    (out,) = llm.generate({"prompt_token_ids": [3, 4, 5, 6]}, params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 5 and out.outputs[0].text == ""
    reference = LLM(tiny_model, device="cpu", max_model_len=128)
    (want,) = reference.generate({"prompt_token_ids": [3, 4, 5, 6]}, params, use_tqdm=False)
    assert out.outputs[0].token_ids == want.outputs[0].token_ids
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("text needs a tokenizer", params, use_tqdm=False)


def test_hf_overrides_are_merged_into_the_config(tiny_model):
    config = EngineArgs.from_kwargs(model=tiny_model, device="cpu",
                                    hf_overrides={"max_position_embeddings": 96}).create_engine_config()
    assert config.model.max_model_len == 96 and config.model.hf_config["max_position_embeddings"] == 96
    with pytest.raises(ValueError, match="hf_overrides"):
        EngineArgs.from_kwargs(model=tiny_model, device="cpu", hf_overrides=[1]).create_engine_config()


def test_generation_config_modes(tiny_model, tmp_path):
    with open(os.path.join(tiny_model, "generation_config.json")) as f:
        own = json.load(f)
    auto = LLM(tiny_model, device="cpu", max_model_len=64).get_default_sampling_params()
    none = LLM(tiny_model, device="cpu", max_model_len=64, generation_config="vllm").get_default_sampling_params()
    assert none.temperature == SamplingParams().temperature
    if "temperature" in own:
        assert auto.temperature == own["temperature"]
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.25, "top_k": 7}))
    folder = LLM(tiny_model, device="cpu", max_model_len=64, generation_config=str(tmp_path))
    assert folder.get_default_sampling_params().top_k == 7
    override = LLM(tiny_model, device="cpu", max_model_len=64, generation_config=str(tmp_path),
                   override_generation_config={"temperature": 0.5, "max_new_tokens": 9})
    defaults = override.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.5, 7, 9)
    with pytest.raises(ValueError, match="generation_config"):
        EngineArgs.from_kwargs(model=tiny_model, device="cpu", generation_config="/no/such").create_engine_config()
