"""`folio` command-line errors: one line on stderr, exit status 2, no usage dump and no traceback.

argparse printed ~87 lines of usage before each error; vLLM flags folio lacks were a bare
"unrecognized arguments"; and errors that were not ValueErrors (a truncated safetensors file)
ended in a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from folio.entrypoints.cli.main import main
from tests.helpers.checkpoints import tiny_model_dir

_CPU = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256"]


def _error_of(argv: list[str], capsys) -> str:
    """The stderr of `folio ARGV`, which must exit with status 2."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("argv", [["serve", "--seed", "1e23"], ["serve", "--max-num-seqs", "many"],
                                  ["serve", "--device", "tpu"]])
def test_a_parse_error_is_one_line_with_a_help_hint(argv, capsys):
    err = _error_of(argv, capsys)
    assert err.count("\n") == 1 and err.startswith("folio serve: error: argument ")
    assert "'folio serve --help'" in err


def test_a_vllm_flag_folio_lacks_is_named_as_such(capsys):
    err = _error_of(["serve", "--long-prefill-token-threshold", "5"], capsys)
    assert err.startswith("folio serve: error: --long-prefill-token-threshold is a vLLM flag that folio does not support")
    err = _error_of(["serve", "--hf-token=abc"], capsys)  # in folio's table, without a flag
    assert "--hf-token is a vLLM flag" in err


def test_an_unknown_flag_gets_a_did_you_mean(capsys):
    err = _error_of(["serve", "--max-num-seqz", "5"], capsys)
    assert "unrecognized arguments: --max-num-seqz (did you mean --max-num-seqs?)" in err
    err = _error_of(["serve", "--frobnicate"], capsys)
    assert "unrecognized arguments: --frobnicate" in err and "did you mean" not in err


def test_nested_subcommands_report_their_own_name(capsys):
    err = _error_of(["bench", "throughput", "--no-such-flag"], capsys)
    assert err.startswith("folio bench throughput: error: unrecognized arguments: --no-such-flag")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama", "cli-errors")


@pytest.mark.parametrize(("flags", "expected"), [
    (["--hf-overrides", '{"num_hidden_layers": 0}'], "hf_overrides (--hf-overrides): num_hidden_layers"),
    (["--override-generation-config", '{"temperature": "hot"}'], "--override-generation-config): 'temperature'"),
    (["--swap-space", "1e30"], "swap_space (--swap-space) = 1e+30 would need"),
    (["--max-num-seqs", str(10**12)], "max_num_seqs (--max-num-seqs)"),
])
def test_bad_engine_flags_are_one_line_naming_the_flag(model, flags, expected, capsys, monkeypatch):
    from folio.engine.arg_utils import EngineArgs
    from folio.entrypoints.openai import api_server

    def config_only(args, core=None):  # the engine's config, and no server that would run on
        EngineArgs.from_cli_args(args).create_engine_config()
        return 0

    monkeypatch.setattr(api_server, "run_server", config_only)
    err = _error_of(["serve", model, *_CPU, *flags], capsys)
    assert err.count("\n") == 1 and err.startswith("folio serve: error: ") and expected in err


def test_a_truncated_checkpoint_exits_non_zero_without_a_traceback(model, tmp_path):
    path = str(tmp_path / "truncated")
    shutil.copytree(model, path)
    weights = os.path.join(path, "model.safetensors")
    os.truncate(weights, os.path.getsize(weights) // 2)
    done = subprocess.run([sys.executable, "-m", "folio", "serve", path, *_CPU, "--port", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"folio serve: error: Cannot read checkpoint file {weights}" in done.stderr
