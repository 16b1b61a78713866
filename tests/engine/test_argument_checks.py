"""Arguments of the wrong type are ValueErrors that name the argument, before anything runs.

Found by a review: strings turned boolean engine flags on ("no" is truthy), and other wrong
types surfaced as TypeErrors or AttributeErrors from deep inside (posixpath, `<`, dict())."""

from __future__ import annotations

import pytest

from folio.engine.arg_utils import EngineArgs
from folio.lora.request import LoRARequest
from folio.pooling_params import PoolingParams
from folio.sampling_params import SamplingParamsError
from folio.transformers_utils.chat_template import ChatTemplateError, check_template_kwargs, render_chat
from tests.helpers.checkpoints import make_tiny_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("args"))


@pytest.mark.parametrize(
    ("name", "value"),
    [("async_scheduling", "false"), ("enable_prefix_caching", "no"), ("enforce_eager", "no"),
     ("enable_chunked_prefill", "no"), ("skip_tokenizer_init", 1), ("enable_lora", "no"),
     ("gpu_memory_utilization", "0.5"), ("swap_space", "1"), ("cpu_kv_cache_space", None),
     ("max_logprobs", "5"), ("max_logprobs", -1), ("max_num_seqs", "2"), ("max_num_batched_tokens", 2.5),
     ("model", 3), ("tokenizer", 3), ("served_model_name", 3)],
)
def test_engine_arguments_of_the_wrong_type_are_refused_by_name(model, name, value):
    kwargs = {"model": model, "device": "cpu", name: value}
    with pytest.raises(ValueError, match=name) as err:
        EngineArgs(**kwargs).create_engine_config()
    assert getattr(err.value, "param", name) == name


def test_real_values_and_the_command_line_still_pass(model):
    import argparse
    from pathlib import Path

    config = EngineArgs(model=Path(model), device="cpu", enable_prefix_caching=False, async_scheduling=False,
                        enforce_eager=True, gpu_memory_utilization=1, max_logprobs=0).create_engine_config()
    assert not config.cache.enable_prefix_caching and not config.scheduler.async_scheduling
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", model, "--device", "cpu", "--no-enable-prefix-caching",
                              "--enforce-eager", "--gpu-memory-utilization", "0.5", "--max-logprobs", "5"])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert not config.cache.enable_prefix_caching and config.cache.gpu_memory_utilization == 0.5


@pytest.mark.parametrize(("kwargs", "name"), [({"pooling_type": 5}, "pooling_type"),
                                              ({"pooling_type": "max"}, "pooling_type"),
                                              ({"normalize": "yes"}, "normalize")])
def test_pooling_params_are_checked_when_made(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PoolingParams(**kwargs)
    assert PoolingParams(pooling_type="mean").pooling_type == "mean"  # resolve() upper-cases it


def test_lists_per_prompt_take_only_their_own_type():
    from folio.entrypoints.llm import _lora_per_prompt, _pooling_per_prompt

    with pytest.raises(ValueError, match="lora_request must be a LoRARequest or a list of them, got str"):
        _lora_per_prompt("adapter", 1)
    with pytest.raises(ValueError, match="pooling_params entries must be PoolingParams, got NoneType"):
        _pooling_per_prompt([None], 1)
    one = LoRARequest("a", 1, "/nowhere")
    assert _lora_per_prompt([one, None], 2) == [one, None]
    assert len(_pooling_per_prompt(None, 2)) == 2


@pytest.mark.parametrize("kwargs", [[1], "x", {3: 1}])
def test_chat_template_kwargs_must_be_a_dict_of_names(kwargs):
    with pytest.raises(ChatTemplateError, match="chat_template_kwargs"):
        check_template_kwargs(kwargs)


def test_a_chat_template_that_is_not_text_is_refused():
    from folio.transformers_utils.chat_template import resolve_chat_template

    with pytest.raises(ChatTemplateError, match="chat_template must be a file path or the template text, got 5"):
        resolve_chat_template(None, None, 5)


@pytest.mark.parametrize("body", ["{% for i in range(10**9) %}{% endfor %}", "{{ 1 / 0 }}",
                                  "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"])
def test_a_template_that_fails_while_rendering_is_a_template_error(body):
    # range(10**9) raised the sandbox's OverflowError unwrapped (a 500 on the server)
    with pytest.raises(ChatTemplateError, match="failed to render"):
        render_chat(body + "{{ messages[0]['content'] }}", [{"role": "user", "content": "hi"}])


def test_chat_flags_must_be_booleans():
    # LLM.chat is checked before any template is looked up: a bare object stands in for the LLM.
    from folio.entrypoints.llm import LLM

    for name in ("add_generation_prompt", "continue_final_message"):
        with pytest.raises(SamplingParamsError, match=f"{name} must be a boolean") as err:
            LLM.chat(object(), [{"role": "user", "content": "hi"}], **{name: "no"})
        assert err.value.param == name
