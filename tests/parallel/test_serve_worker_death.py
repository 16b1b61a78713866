"""`folio serve -tp 2` on the CPU: it serves, and when a worker is killed it exits non-zero
within seconds, naming the dead rank (no hang, no server answering for a broken engine)."""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.server.test_lifecycle import ServerProcess, _children

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


def _worker_pid(server_pid: int) -> int:
    for pid in _children(server_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            return pid
    raise AssertionError(f"no tensor-parallel worker among the children of {server_pid}")


def test_serve_exits_nonzero_soon_after_a_worker_dies(tmp_path) -> None:
    path = make_tiny_checkpoint("llama", tmp_path / "llama")
    server = ServerProcess([sys.executable, "-m", "folio", "serve", "--model", path, "--port", "0",
                            "--device", "cpu", "--dtype", "float32", "--max-model-len", "128",
                            "--tensor-parallel-size", "2"])
    try:
        reply = httpx.post(f"{server.url}/v1/completions", json={"model": path, "prompt": [1, 2, 3], "max_tokens": 3},
                           timeout=60)
        assert reply.status_code == 200, reply.text
        os.kill(_worker_pid(server.proc.pid), 9)
        start = time.monotonic()
        code = server.proc.wait(timeout=15)
        assert code != 0
        assert time.monotonic() - start < 10
        time.sleep(0.5)  # the drain thread reads the last lines
        log = "".join(server.lines)
        assert "[rank 0] Tensor-parallel worker rank 1" in log and "SIGKILL" in log, log[-2000:]
    finally:
        server.stop()


def test_sigterm_to_the_whole_group_finishes_in_flight_and_exits_0(tmp_path) -> None:
    """systemd signals every process of the service: the workers leave that SIGTERM to rank 0,
    which finishes the stream and stops them in order (they used to die under it)."""
    import json
    import signal

    path = make_tiny_checkpoint("llama", tmp_path / "llama")
    server = ServerProcess([sys.executable, "-m", "folio", "serve", "--model", path, "--port", "0",
                            "--device", "cpu", "--dtype", "float32", "--max-model-len", "128",
                            "--tensor-parallel-size", "2", "--shutdown-timeout", "60"], new_session=True)
    try:
        body = {"model": path, "prompt": [1, 2, 3], "max_tokens": 48, "ignore_eos": True, "stream": True}
        rest = server.stream_then(body, lambda: server.signal_group(signal.SIGTERM), timeout=60)
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(timeout=60) == 0, "".join(server.lines)[-3000:]
        time.sleep(0.5)  # the drain thread reads the last lines
        assert "ERROR" not in "".join(server.lines), "".join(server.lines)[-3000:]
    finally:
        server.stop()
