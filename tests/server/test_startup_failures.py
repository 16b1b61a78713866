"""A server that cannot start says why in one line, exits non-zero, and stops its engine.

Every failure after the engine exists counts: the app (a chat template that is not one), a flag
check, TLS files that are not PEM, an adapter of --lora-modules. With the engine in a process
of its own such a failure used to print the error and then hang: the interpreter's exit waited
on the engine process, which leaves SIGTERM to the server.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from folio.entrypoints.openai.api_server import main
from tests.helpers.adapters import make_peft_adapter
from tests.server.harness import HANG_LIMIT_S

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256", "--port", "0"]


def _serve(checkpoint: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "FOLIO_API_KEY": ""}
    return subprocess.run([sys.executable, "-m", "folio", "serve", checkpoint, *FLAGS, "--engine-process", *extra],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=HANG_LIMIT_S)


def _not_pem(tmp_path) -> str:
    path = tmp_path / "not-a-key.pem"
    path.write_text("not a PEM file\n")
    return str(path)


@pytest.mark.parametrize("case", ["chat-template", "lora-without-enable-lora", "bad-certificate"])
def test_an_error_after_the_engine_process_started_exits_with_one_line(checkpoint, tmp_path, case):
    extra, expected = {
        "chat-template": (["--chat-template", "/nope.jinja"], "Chat template '/nope.jinja'"),
        "lora-without-enable-lora": (["--lora-modules", f"a={tmp_path}"], "--lora-modules needs --enable-lora"),
        "bad-certificate": (["--ssl-keyfile", _not_pem(tmp_path), "--ssl-certfile", _not_pem(tmp_path)],
                            "--ssl-keyfile/--ssl-certfile: cannot load"),
    }[case]
    done = _serve(checkpoint, *extra)  # hung (until the timeout) before the fix
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("folio serve: error: ") and expected in last, done.stderr


@pytest.fixture(scope="module")
def adapters(checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("startup-adapters")
    return {"r4": make_peft_adapter(checkpoint, root / "r4", seed=1, r=4, lora_alpha=8),
            "r16": make_peft_adapter(checkpoint, root / "r16", seed=2, r=16, lora_alpha=16)}


@pytest.fixture
def heap_left_unfrozen(monkeypatch):
    """run_server freezes the heap for the rest of the process (startup_heap): undone after an
    in-process run, so tests that run later see the process as they would alone."""
    from folio.engine import startup_heap

    monkeypatch.setattr(startup_heap, "_process_frozen", startup_heap._process_frozen)
    was_frozen = gc.get_freeze_count() > 0
    yield
    if not was_frozen:
        gc.unfreeze()


@pytest.mark.parametrize("case", ["missing", "duplicate", "rank", "not-an-adapter"])
def test_a_bad_lora_module_is_one_line_naming_the_entry(checkpoint, adapters, tmp_path, capsys, case,
                                                        heap_left_unfrozen):
    entries, expected = {
        "missing": ([f"a={tmp_path}/nope"], f"--lora-modules a={tmp_path}/nope: LoRA adapter folder"),
        "duplicate": ([f"a={adapters['r4']}", f"a={adapters['r16']}"], "--lora-modules names 'a' more than once"),
        "rank": ([f"wide={adapters['r16']}"], f"--lora-modules wide={adapters['r16']}: Adapter 'wide' has rank 16"),
        "not-an-adapter": ([f"a={checkpoint}"], f"--lora-modules a={checkpoint}: LoRA adapter folder"),
    }[case]
    # In this process, the engine on a thread: before the fix uvicorn's lifespan failed (a
    # traceback, "Application startup failed") and exited with status 3.
    argv = ["--model", checkpoint, *FLAGS, "--enable-lora", "--max-lora-rank", "8", "--lora-modules", *entries]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Application startup failed" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"folio serve: error: {expected}"), err


def test_a_bad_lora_module_stops_the_engine_process(checkpoint, tmp_path):
    done = _serve(checkpoint, "--enable-lora", "--lora-modules", f"a={tmp_path}/nope")
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"folio serve: error: --lora-modules a={tmp_path}/nope: "), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
