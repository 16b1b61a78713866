"""How fast the server takes in W1's requests: from the client's first send to each AddCommand's
arrival in the engine process (issue 11), on the CPU, no GPU.

A real `folio serve` stack (run_server: uvicorn, FastAPI, AsyncLLM, EngineProcess with its pipe,
writer and reader threads, the EngineLoop in a child) with a stand-in engine in the child: it
records when each request was added, and steps on a timer instead of a GPU. The client is the
benchmark's own (`folio bench serve`'s send_request, streamed completions of W1's token ids; its
lean asyncio client, or httpx with `--http-client httpx`), all requests at once.

    PYTHONPATH=. python scripts/ingest_bench.py                 # paused engine: pure ingestion
    PYTHONPATH=. python scripts/ingest_bench.py --mode stream   # prefill/decode steps meanwhile
    PYTHONPATH=. python scripts/ingest_bench.py --profile /tmp/ingest.prof   # cProfile the server

Modes: `paused`: the engine takes every request and steps nothing (10 ms sleeps) until all N are
in, then finishes each with one token; `stream`: steps as W1 on an H100 would pace them (a
16,384-token prefill budget, ~6 ms + 1.8 us per token a step, a slept GPU), each request
streaming `--output-len` tokens, so the server streams early requests' tokens while later ones
still come in. Reported per run: the window from the first send to the last (median, first)
arrival in the engine, the server process's CPU per request, and the client's duration and TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

QWEN = "folio/benchmarks/configs/qwen3-0.6b"
WARM_UP_LEN = 16  # the client's warm-up prompt is this long (W1's are >= 100)


# ---- the engine process's stand-in ------------------------------------------------------------


class FakeEngine:
    """What EngineLoop and run_engine_process call on an LLMEngine, with steps on a timer."""

    def __init__(self, config, mode: str, expect: int, output_len: int, arrivals_path: str) -> None:
        from folio.engine.engine_stats import EngineStats
        from folio.sampling_params import SamplingParams

        self.config = config
        self.mode, self.expect, self.output_len, self.arrivals_path = mode, expect, output_len, arrivals_path
        self.output_processor = SimpleNamespace(wire_records=True)
        self._stats = EngineStats(0, 0, 1, 1, 0.0, 0)
        self._default = SamplingParams()
        self.arrivals: list[float] = []
        self.waiting: list[list] = []  # [request id, prompt length, tokens left, arrival]
        self.running: list[list] = []

    def isolate_request_errors(self) -> None:
        pass

    def get_tokenizer(self):
        return None

    def default_sampling_params(self):
        return self._default.clone()

    def stats(self):
        return self._stats

    def take_request_errors(self) -> dict:
        return {}

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request_id, prompt, params, priority=0, lora_request=None) -> None:
        now = time.perf_counter()
        length = len(prompt["prompt_token_ids"])
        left = self.output_len if self.mode == "stream" else 1
        self.waiting.append([request_id, length, min(left, params.max_tokens), now])
        if length <= WARM_UP_LEN:  # the client's warm-up: not timed, never paused
            return
        self.arrivals.append(now)
        if len(self.arrivals) == self.expect:
            with open(self.arrivals_path, "a") as f:
                f.write(json.dumps(self.arrivals) + "\n")
            self.arrivals = []

    def abort_request(self, request_ids) -> None:
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        self.waiting = [r for r in self.waiting if r[0] not in ids]
        self.running = [r for r in self.running if r[0] not in ids]

    def step(self) -> list:
        if self.mode == "paused":
            if self.arrivals:  # still taking requests in: a step of nothing, as long as a prefill's
                time.sleep(0.01)
                return []
            self.running, self.waiting = self.running + self.waiting, []
            return self._tokens(time.perf_counter(), self.running, first=set(r[0] for r in self.running))
        budget = 16384 - len(self.running)
        admitted, tokens = [], len(self.running)
        while self.waiting and self.waiting[0][1] <= budget:
            r = self.waiting.pop(0)
            budget -= r[1]
            tokens += r[1]
            admitted.append(r)
        time.sleep(0.006 + 1.8e-6 * tokens)  # the GPU
        decoding = self.running
        self.running = decoding + admitted
        return self._tokens(time.perf_counter(), self.running, first=set(r[0] for r in admitted))

    def _tokens(self, now: float, requests: list[list], first: set[str]) -> list:
        from folio.outputs import CompletionOutput, RequestMetrics, RequestOutput

        outputs = []
        for r in requests:
            r[2] -= 1
            finish = ("length", None) if r[2] <= 0 else None
            if r[0] in first:  # a full record first, as the output processor sends
                completion = CompletionOutput(0, "", [7], None, None, *(finish or (None, None)))
                outputs.append(RequestOutput(r[0], None, [], None, [completion], finish is not None,
                                             RequestMetrics(r[3], now, now, now, now if finish else None)))
            else:
                outputs.append((r[0], "", [7], finish, now))
        self.running = [r for r in self.running if r[2] > 0]
        return outputs


def make_fake_engine(mode: str, expect: int, output_len: int, arrivals_path: str) -> FakeEngine:
    from folio.engine.arg_utils import EngineArgs

    config = EngineArgs(model=QWEN, load_format="dummy", max_model_len=4096, dtype="bfloat16",
                        served_model_name="qwen3-0.6b").create_engine_config()
    return FakeEngine(config, mode, expect, output_len, arrivals_path)


def serve(args: argparse.Namespace) -> None:
    """The server process: `folio serve`'s run_server around an EngineProcess of the fake engine."""
    from folio.engine.engine_core import EngineProcess
    from folio.entrypoints.openai.api_server import make_parser, run_server

    core = EngineProcess(functools.partial(make_fake_engine, args.mode, args.num_requests,
                                           args.output_len, args.arrivals))
    core.wait_ready()
    server_args = make_parser().parse_args([
        "--model", QWEN, "--load-format", "dummy", "--dtype", "bfloat16", "--max-model-len", "4096",
        "--served-model-name", "qwen3-0.6b", "--port", str(args.port), *args.server_args])
    if not args.profile:
        run_server(server_args, core=core)
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run_server(server_args, core=core)
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)


class NullHTTP:
    """`--mode null`: no folio at all, a raw asyncio server that answers each POST at once with
    a one-token stream (and records when its body was in), to time the client alone."""

    def __init__(self, expect: int, arrivals_path: str) -> None:
        self.expect, self.arrivals_path, self.arrivals = expect, arrivals_path, []

    def protocol(self) -> asyncio.Protocol:
        server = self

        class Connection(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                self.transport, self.buffer = transport, b""

            def data_received(self, data: bytes) -> None:
                self.buffer += data
                while b"\r\n\r\n" in self.buffer:
                    head, rest = self.buffer.split(b"\r\n\r\n", 1)
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    if len(rest) < length:
                        return
                    self.buffer = rest[length:]
                    server.answer(self.transport, head, rest[:length])

        return Connection()

    def answer(self, transport, head: bytes, body: bytes) -> None:
        if head.startswith(b"POST") and len(body) > 400:  # not the warm-up
            self.arrivals.append(time.perf_counter())
            if len(self.arrivals) == self.expect:
                with open(self.arrivals_path, "a") as f:
                    f.write(json.dumps(self.arrivals) + "\n")
                self.arrivals = []
        if head.startswith(b"GET"):
            payload = b'{"object":"list","data":[]}'
            transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                            + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            return
        events = (b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null}\n\n'
                  b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
                  b"data: [DONE]\n\n")
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                        + str(len(events)).encode() + b"\r\n\r\n" + events)


def serve_null(args: argparse.Namespace) -> None:
    async def run() -> None:
        null = NullHTTP(args.num_requests, args.arrivals)
        server = await asyncio.get_running_loop().create_server(null.protocol, "127.0.0.1", args.port, backlog=1024)
        await server.serve_forever()

    asyncio.run(run())


# ---- the client -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(url: str, requests, pid: int, arrivals_path: str, lines_before: int, http_client: str) -> dict:
    import httpx

    from folio.benchmarks.serve_client import send_request

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600, connect=30.0)) as httpx_client:
        client = httpx_client if http_client == "httpx" else None
        warm = await send_request(client, url, "qwen3-0.6b", type(requests[0])(requests[0].prompt_token_ids[:WARM_UP_LEN], 1))
        if not warm.success:
            raise SystemExit(f"warm-up failed: {warm.error}")
        cpu0, client0 = cpu_seconds(pid), time.process_time()
        start = time.perf_counter()
        traces = await asyncio.gather(*(send_request(client, url, "qwen3-0.6b", r) for r in requests))
        duration = time.perf_counter() - start
        cpu, client_cpu = cpu_seconds(pid) - cpu0, time.process_time() - client0
    failed = [t for t in traces if not t.success]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed: {failed[0].error}")
    for _ in range(100):  # the engine writes the arrivals of a batch once it has all of them
        with open(arrivals_path) as f:
            lines = f.read().splitlines()
        if len(lines) > lines_before:
            break
        await asyncio.sleep(0.05)
    arrivals = sorted(a - start for a in json.loads(lines[lines_before]))
    return {
        "window_ms": 1e3 * arrivals[-1], "median_arrival_ms": 1e3 * statistics.median(arrivals),
        "first_arrival_ms": 1e3 * arrivals[0], "server_cpu_ms_per_request": 1e3 * cpu / len(requests),
        "client_cpu_ms_per_request": 1e3 * client_cpu / len(requests),
        "duration_s": duration, "mean_ttft_ms": 1e3 * statistics.mean(t.ttft_s for t in traces),
    }


def client(args: argparse.Namespace) -> None:
    from folio.benchmarks.workloads import BenchRequest, w1

    requests = w1().requests[: args.num_requests]
    requests = [BenchRequest(r.prompt_token_ids, min(r.output_len, args.output_len)) for r in requests]
    if os.path.exists(args.arrivals):
        os.remove(args.arrivals)
    open(args.arrivals, "w").close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--serve", "--port", str(port), "--mode", args.mode,
           "--num-requests", str(args.num_requests), "--output-len", str(args.output_len),
           "--arrivals", args.arrivals, *(["--profile", args.profile] if args.profile else [])]
    if args.server_args:
        cmd += ["--server-args", *args.server_args]
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "FOLIO_WARM_UP": "0"}  # no GPU warm-up
    log = open(args.arrivals + ".server.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, server)
        rows = []
        for i in range(args.runs):
            row = asyncio.run(one_run(url + "/v1/completions", requests, server.pid, args.arrivals, i,
                                      args.http_client))
            rows.append(row)
            print(f"run {i}: " + "  ".join(f"{k} {v:.3f}" if k == "duration_s" else f"{k} {v:.1f}"
                                           for k, v in row.items()), flush=True)
        medians = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
        print(f"median of {len(rows)} runs: " + json.dumps(medians))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mode": args.mode, "http_client": args.http_client, "num_requests": args.num_requests, "runs": rows}, f, indent=1)
    finally:
        server.terminate()  # the server's own SIGTERM path: it stops the engine process too
        server.wait(timeout=60)
        log.close()


def _wait_ready(url: str, server: subprocess.Popen) -> None:
    import httpx

    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}); see its log")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the server did not come up in 120 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("paused", "stream", "null"), default="paused")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--http-client", choices=("asyncio", "httpx"), default="asyncio",
                   help="the benchmark's client: its lean asyncio one, or httpx")
    p.add_argument("--output-len", type=int, default=64, help="tokens per request in stream mode")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--arrivals", default="/tmp/folio-ingest-arrivals.jsonl")
    p.add_argument("--profile", default=None, help="cProfile the server's main thread into this file")
    p.add_argument("--json", default=None)
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="more `folio serve` arguments (last on the line)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not 1 <= args.num_requests <= 256:  # the stand-in engine waits for this many W1 requests
        p.error(f"--num-requests must be 1..256 (W1 has 256 requests), got {args.num_requests}.")
    if args.serve:
        serve_null(args) if args.mode == "null" else serve(args)
    else:
        client(args)


if __name__ == "__main__":
    main()
