"""Lifecycle: disconnects abort and free KV blocks, many clients at once, SIGTERM, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from openai import AsyncOpenAI

from tests.server.conftest import API_KEY
from tests.server.harness import HANG_LIMIT_S, HeldEngine, wait_for

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _aborted(server) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("folio:request_success_total{") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no abort counter")


def _all_blocks_free(server) -> bool:
    stats = server.engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0 and stats.num_free_blocks == stats.num_blocks


def test_disconnect_mid_stream_aborts_and_frees_every_block(server, model_name):
    before = _aborted(server)
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": True,
            "stream": True}
    with HeldEngine(server.engine.engine, held=False) as held:
        with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=HANG_LIMIT_S) as r:
            events = r.iter_lines()
            first = [next(events) for _ in range(4)]
            held.hold()  # the engine stops at its next step: the request cannot finish meanwhile
            assert server.engine.stats().num_running == 1
        wait_for(lambda: server.engine.num_in_flight == 0, "the server to notice the disconnect")
    assert all('"finish_reason":null' in e for e in first if e)
    wait_for(lambda: _all_blocks_free(server), "the aborted request's blocks to return")
    assert _aborted(server) == before + 1


def test_disconnect_while_waiting_for_a_whole_response_aborts(server, model_name):
    before = _aborted(server)
    body = json.dumps({"model": model_name, "prompt": "Hello", "max_tokens": 240, "ignore_eos": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with HeldEngine(server.engine.engine, held=False) as held:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(request)
            wait_for(lambda: server.engine.stats().num_running == 1, "the request to run")
            held.hold()
        wait_for(lambda: server.engine.num_in_flight == 0, "the server to notice the disconnect")
    wait_for(lambda: _all_blocks_free(server), "the aborted request's blocks to return")
    assert _aborted(server) == before + 1


def test_64_concurrent_streaming_clients_all_complete(server, model_name, client):
    prompts = [f"Story number {i}: once" for i in range(64)]

    async def one(api: AsyncOpenAI, prompt: str, max_tokens: int) -> tuple[str, str | None]:
        text, finish = "", None
        stream = await api.completions.create(model=model_name, prompt=prompt, max_tokens=max_tokens,
                                              temperature=0, stream=True, extra_body={"ignore_eos": True})
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def main():
        async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=HANG_LIMIT_S) as api:
            return await asyncio.gather(*(one(api, p, 8 + i % 24) for i, p in enumerate(prompts)))

    results = asyncio.run(main())
    assert [finish for _, finish in results] == ["length"] * 64
    for i in (0, 17, 63):  # batched streaming text is the text of the request alone
        alone = client.completions.create(model=model_name, prompt=prompts[i], max_tokens=8 + i % 24,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert results[i][0] == alone.choices[0].text
    wait_for(lambda: _all_blocks_free(server), "every request to finish")


# ---- a server process -------------------------------------------------------------------------


class ServerProcess:
    """`cmd` run as a server process; its stderr is drained, and its URL read from the log."""

    def __init__(self, cmd: list[str], new_session: bool = False) -> None:
        env = {**os.environ, "PYTHONPATH": REPO, "FOLIO_API_KEY": ""}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env=env, cwd=REPO, start_new_session=new_session)
        self.new_session = new_session  # then the server leads its own process group
        self.lines: list[str] = []
        self.url: str | None = None
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            wait_for(lambda: self.url is not None or self.proc.poll() is not None, "the server to log its URL")
            assert self.url, "".join(self.lines)
            wait_for(self._healthy, "the server to answer /health")
        except BaseException:
            self.stop()
            raise

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            if match and self.url is None:
                self.url = match.group(1)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health").status_code == 200
        except httpx.TransportError:
            return False

    def stream_then(self, body: dict, act, timeout: float = HANG_LIMIT_S) -> list[str]:
        """Stream a completion; after its first event call act() (e.g. send a signal), then
        return the stream's remaining non-empty lines."""
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=timeout) as r:
            events = r.iter_lines()
            assert next(events).startswith("data: ")
            act()
            return [line for line in events if line]

    def signal_group(self, sig: int) -> None:
        """Signal every process of the server's group, as systemd stops a service."""
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None and self.new_session:
            self.signal_group(signal.SIGKILL)  # the engine and workers too
        elif self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_folio_serve_demo_model_finishes_in_flight_on_sigterm_and_exits_0():
    # The engine in its own process here: its shutdown is the longer path.
    server = ServerProcess([sys.executable, "-m", "folio", "serve", "--port", "0", "--device", "cpu",
                            "--max-model-len", "512", "--shutdown-timeout", "60", "--engine-process"])
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 64, "ignore_eos": True, "stream": True}
        rest = server.stream_then(body, lambda: server.proc.send_signal(signal.SIGTERM))
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(HANG_LIMIT_S) == 0, "".join(server.lines)
        assert any("Started the engine process" in line for line in server.lines), "".join(server.lines)
    finally:
        server.stop()


def test_sigterm_to_the_whole_group_still_finishes_in_flight_and_logs_no_crash():
    """systemd (and `timeout`) signal every process of the service: the engine process leaves
    that SIGTERM to the server, which finishes the stream and stops the engine in order."""
    server = ServerProcess([sys.executable, "-m", "folio", "serve", "--port", "0", "--device", "cpu",
                            "--max-model-len", "512", "--shutdown-timeout", "60", "--engine-process"],
                           new_session=True)
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 64, "ignore_eos": True, "stream": True}
        rest = server.stream_then(body, lambda: server.signal_group(signal.SIGTERM))
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(HANG_LIMIT_S) == 0, "".join(server.lines)
        log = "".join(server.lines)
        assert "engine process exited" not in log and "ERROR" not in log, log
    finally:
        server.stop()


def test_api_server_module_aborts_what_outlives_the_grace_period(checkpoint):
    server = ServerProcess([sys.executable, "-m", "folio.entrypoints.openai.api_server", "--model", checkpoint,
                            "--port", "0", "--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                            "--shutdown-timeout", "0", "--disable-uvicorn-access-log"])
    try:
        body = {"prompt": "Hello", "max_tokens": 250, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=HANG_LIMIT_S) as r:
            events = r.iter_lines()
            assert next(events).startswith("data: ")
            server.proc.send_signal(signal.SIGTERM)
            try:
                rest = [line for line in events if line]
            except httpx.TransportError:  # the connection was dropped mid-stream
                rest = []
        assert not rest or '"finish_reason":"length"' not in rest[-2]
        assert server.proc.wait(HANG_LIMIT_S) == 0, "".join(server.lines)
    finally:
        server.stop()


def test_api_server_refuses_a_taken_port(capsys):
    from folio.entrypoints.openai.api_server import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["--port", str(taken.getsockname()[1]), "--device", "cpu"]) == 2
    assert "Cannot listen" in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_server_while_it_starts_stops_the_engine_process(how):
    env = {**os.environ, "PYTHONPATH": REPO, "FOLIO_API_KEY": ""}
    proc = subprocess.Popen([sys.executable, "-m", "folio", "serve", "--device", "cpu", "--engine-process",
                             "--port", "0"], stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        wait_for(lambda: _children(proc.pid), "the engine process to start")
        kids = _children(proc.pid)
        proc.send_signal(how)
        proc.wait(HANG_LIMIT_S)
        # At once: without a SIGTERM handler and PDEATHSIG it would run on until its engine was
        # built and its first message found the pipe closed.
        wait_for(lambda: not any(_running(k) for k in kids), "the engine process to stop with the server", 2.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
