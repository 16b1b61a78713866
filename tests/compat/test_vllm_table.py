"""Walk folio/engine/vllm_args.py's table: every accepted value is taken, every refused value
raises a ValueError naming the argument and the value, by keyword and by flag; nothing is in
neither; docs/vllm-compat.md is current."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib

import pytest

from folio.engine.arg_utils import EngineArgs
from folio.engine.vllm_args import ANY, NO_BAD_VALUE, VLLM_ARGS, Status, effective_status
from folio.entrypoints.openai.cli_args import make_arg_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIELDS = EngineArgs.field_names()
# folio's own arguments that vLLM does not have (everything else must be a table row).
FOLIO_ONLY = {"device", "cpu_kv_cache_space", "attention_backend"}
# One valid non-default value for each honoured argument, and where EngineArgs keeps it.
HONOURED_SAMPLES = {
    "model": "org/name", "tokenizer": "tok", "served_model_name": ["a"], "dtype": "bfloat16", "seed": 7,
    "max_model_len": 64, "max_logprobs": 5, "enforce_eager": True, "skip_tokenizer_init": True,
    "hf_overrides": {"rope_theta": 1.0}, "generation_config": "vllm", "override_generation_config": {"top_k": 3},
    "load_format": "dummy", "block_size": 32, "gpu_memory_utilization": 0.5, "num_gpu_blocks_override": 10,
    "swap_space": 1.0, "enable_prefix_caching": False, "max_num_seqs": 8, "max_num_batched_tokens": 512,
    "enable_chunked_prefill": False, "scheduling_policy": "priority", "async_scheduling": False,
    "preemption_mode": "swap", "pooler_config": {"pooling_type": "MEAN"},
}
EXPECTED = {"served_model_name": "a"}  # vLLM's list of names: folio serves the first


def _parser() -> argparse.ArgumentParser:
    return make_arg_parser(argparse.ArgumentParser(prog="folio serve"))


def _flag_argv(row, value) -> list[str]:
    if isinstance(value, bool):
        return [row.flag] if value else []
    return [row.flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]


def test_every_engine_argument_is_in_the_table_or_folio_own():
    assert FIELDS - {r.name for r in VLLM_ARGS} == FOLIO_ONLY
    assert len({r.name for r in VLLM_ARGS}) == len(VLLM_ARGS)


def test_unknown_argument_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="no_such_arg"):
        EngineArgs.from_kwargs(no_such_arg=1)


def test_engine_args_constructed_directly_takes_vllm_names_like_llm():
    """EngineArgs(...) (the dataclass itself, as vLLM users build it) checks vLLM-only names
    against the table as LLM(...) does, instead of a bare TypeError from __init__."""
    args = EngineArgs(model="m", trust_remote_code=True, disable_log_stats=True, tokenizer_mode="auto",
                      seed=None, served_model_name=["a"], max_num_seqs=8)
    assert (args.model, args.seed, args.served_model_name, args.max_num_seqs) == ("m", 0, "a", 8)
    assert "trust_remote_code" not in vars(args)  # checked, not stored
    with pytest.raises(ValueError, match="pipeline_parallel_size=2"):
        EngineArgs(pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="revision='main'"):
        EngineArgs("org/name", revision="main")  # the check sees a positional model too
    # Dataclass semantics stay: fields(), vars(), replace() (which goes through __init__).
    assert {f.name for f in dataclasses.fields(args)} == FIELDS == set(vars(args))
    changed = dataclasses.replace(args, max_num_seqs=4)
    assert (changed.max_num_seqs, changed.served_model_name, changed.model) == (4, "a", "m")
    assert EngineArgs("m") == EngineArgs(model="m")
    with pytest.raises(ValueError, match="kv_transfer_config"):
        dataclasses.replace(args, kv_transfer_config={"kv_connector": "x"})


def test_unknown_engine_argument_is_a_value_error_naming_it_and_the_nearest_name():
    for make in (EngineArgs, EngineArgs.from_kwargs):
        with pytest.raises(ValueError, match=r"'max_num_seq' \(did you mean 'max_num_seqs'\?\)") as caught:
            make(max_num_seq=4)
        assert isinstance(caught.value, TypeError)  # what vLLM raises for an unknown keyword
    with pytest.raises(ValueError, match="'zzz_qqq'") as caught:
        EngineArgs(zzz_qqq=1)
    assert "did you mean" not in str(caught.value)


@pytest.mark.parametrize("row", [r for r in VLLM_ARGS if effective_status(r, FIELDS) is Status.HONOURED],
                         ids=lambda r: r.name)
def test_honoured_rows_reach_engine_args(row):
    if row.name not in HONOURED_SAMPLES:  # a pending row whose work has landed: its own tests cover it
        assert row.status is Status.PENDING and row.name in FIELDS
        EngineArgs.from_kwargs(**{row.name: getattr(EngineArgs(), row.name)})
        return
    value = HONOURED_SAMPLES[row.name]
    args = EngineArgs.from_kwargs(**{row.name: value})
    assert getattr(args, row.name) == EXPECTED.get(row.name, value)


@pytest.mark.parametrize("row", [r for r in VLLM_ARGS if effective_status(r, FIELDS) is not Status.HONOURED],
                         ids=lambda r: r.name)
def test_other_rows_accept_their_values_and_refuse_the_rest(row, tiny_model):
    accepted = (None, "x", 1, True) if row.accepted is ANY else row.accepted
    for value in accepted:
        EngineArgs.from_kwargs(model=tiny_model, **{row.name: value})  # no error: a no-op
    if row.bad is NO_BAD_VALUE:
        return
    with pytest.raises(ValueError) as caught:
        EngineArgs.from_kwargs(model="org/name", **{row.name: row.bad})
    message = str(caught.value)
    assert row.name in message and repr(row.bad) in message
    if effective_status(row, FIELDS) is Status.PENDING:
        assert "not supported yet" in message and row.owner in message


@pytest.mark.parametrize("row", [r for r in VLLM_ARGS if r.cli is not None or r.name in FIELDS], ids=lambda r: r.name)
def test_every_row_has_its_vllm_flag(row):
    parser = _parser()
    assert any(row.flag in a.option_strings for a in parser._actions), row.flag
    args = parser.parse_args([])
    EngineArgs.from_cli_args(args)  # every default is accepted
    if effective_status(row, FIELDS) is not Status.HONOURED and row.bad is not NO_BAD_VALUE:
        bad = parser.parse_args(["--model", "org/name", *_flag_argv(row, row.bad)])
        with pytest.raises(ValueError, match=row.name):
            EngineArgs.from_cli_args(bad)


def test_served_model_name_takes_one_name():
    assert EngineArgs.from_cli_args(_parser().parse_args(["--served-model-name", "m"])).served_model_name == "m"
    with pytest.raises(ValueError, match="one name"):
        EngineArgs.from_cli_args(_parser().parse_args(["--served-model-name", "a", "b"]))


def test_vllm_short_flags_and_json_flags():
    args = _parser().parse_args(["-tp", "1", "-O", "3", "--hf-overrides", '{"a": 1}', "--trust-remote-code"])
    engine = EngineArgs.from_cli_args(args)
    assert engine.hf_overrides == {"a": 1}
    with pytest.raises(SystemExit):
        _parser().parse_args(["--hf-overrides", "{not json"])


def test_help_is_grouped_like_vllm(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    text = capsys.readouterr().out
    order = [text.index(f"\n{title}:") for title in
             ("Frontend", "ModelConfig", "LoadConfig", "ParallelConfig", "CacheConfig", "SchedulerConfig")]
    assert order == sorted(order)
    model_section = text[text.index("\nModelConfig:"): text.index("\nLoadConfig:")]
    assert "--trust-remote-code" in model_section and "--max-model-len" in model_section
    assert "--tensor-parallel-size" in text[text.index("\nParallelConfig:"):]


def test_compat_doc_is_current():
    spec = importlib.util.spec_from_file_location("vllm_compat_doc", ROOT / "scripts" / "vllm_compat_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "vllm-compat.md").read_text() == module.render(), (
        "run `python scripts/vllm_compat_doc.py > docs/vllm-compat.md`"
    )


def test_a_no_op_argument_given_a_value_is_logged_and_cli_defaults_are_not(caplog):
    """A vLLM argument folio accepts but does nothing with is never dropped in silence: a value
    the user gave is a warning naming it and why; the CLI's defaults (every flag is passed) are not."""
    from folio.entrypoints.openai.cli_args import make_arg_parser

    parser = make_arg_parser(argparse.ArgumentParser())
    with caplog.at_level("WARNING", logger="folio.engine.vllm_args"):
        EngineArgs.from_cli_args(parser.parse_args([]))
        assert caplog.text == ""
        EngineArgs(model="m", cuda_graph_sizes=[1, 2], trust_remote_code=False)
    assert "vLLM argument cuda_graph_sizes=[1, 2] has no effect in folio: folio captures" in caplog.text
    assert "trust_remote_code" not in caplog.text  # False is its default: nothing was asked
