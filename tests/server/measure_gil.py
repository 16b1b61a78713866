"""Would HTTP starve the engine thread at GPU speed? A stand-in engine with GPU-like steps.

    python -m tests.server.measure_gil [--streams 256] [--python-ms 4] [--device-ms 10]

A CPU test machine steps far slower than a GPU, so the event loop's share of the GIL looks
small there. This stand-in engine takes `--python-ms` of pure Python per step (holding the GIL,
as scheduling and output processing do) and then waits `--device-ms` without it (as a CUDA sync
does), producing one token for each of up to `--streams` running requests. It runs behind the
real app and AsyncLLM in this process; the clients are another process reading raw bytes, so
their cost stays off this process's GIL. Printed: engine steps/s alone (no HTTP) and serving
`--streams` streaming clients, the event loop's CPU, and the same under smaller GIL switch
intervals, and with the stand-in in a process of its own (EngineProcess). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from folio.engine.async_llm import AsyncLLM
from folio.engine.engine_core import EngineProcess
from folio.engine.engine_stats import EngineStats
from folio.outputs import CompletionOutput, RequestMetrics, RequestOutput
from folio.sampling_params import SamplingParams
from tests.helpers.tokenizers import save_test_tokenizer, test_tokenizer


@dataclass
class _ModelConfig:
    served_model_name: str = "stand-in"
    max_model_len: int = 100_000
    vocab_size: int = 1000
    tokenizer: str = ""
    model: str = ""


@dataclass
class _Config:
    model: _ModelConfig


class StandInEngine:
    """LLMEngine's interface, with steps that cost fixed GIL-held and GIL-free time."""

    def __init__(self, python_ms: float, device_ms: float, tokenizer_dir: str) -> None:
        self.config = _Config(_ModelConfig(tokenizer=tokenizer_dir))
        self.python_s, self.device_s = python_ms / 1e3, device_ms / 1e3
        self.requests: dict[str, list] = {}  # id -> [prompt ids, tokens left, tokens made]
        self.steps = 0

    def get_tokenizer(self):
        return test_tokenizer()

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    def isolate_request_errors(self) -> None:
        pass

    def take_request_errors(self) -> dict:
        return {}

    def add_request(self, request_id, prompt, params, arrival_time=None, priority=0) -> None:
        self.requests[request_id] = [list(prompt["prompt_token_ids"]), params.max_tokens, 0]

    def abort_request(self, request_ids) -> None:
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        return EngineStats(len(self.requests), 0, 1000, 1000, 0.0, 0)

    def step(self) -> list[RequestOutput]:
        end = time.perf_counter() + self.python_s
        while time.perf_counter() < end:  # scheduling, sampling bookkeeping, detokenizing
            pass
        time.sleep(self.device_s)  # the device computes; the GIL is free meanwhile
        self.steps += 1
        outputs = []
        for request_id, state in list(self.requests.items()):
            state[1] -= 1
            state[2] += 1
            finished = state[1] == 0
            completion = CompletionOutput(0, " x", [42], None, None, "length" if finished else None)
            outputs.append(RequestOutput(request_id, None, state[0], None, [completion], finished,
                                         RequestMetrics(arrival_time=0.0)))
            if finished:
                del self.requests[request_id]
        return outputs


CLIENT = r'''
import asyncio, json, sys
host, port, streams, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
async def one():
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": max_tokens, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    tail = b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        tail = (tail + data)[-32:]
        if b"data: [DONE]" in tail:
            break
    writer.close()
async def main():
    await asyncio.gather(*(one() for _ in range(streams)))
asyncio.run(main())
'''


def run_alone(engine: StandInEngine, streams: int, max_tokens: int) -> float:
    """Steps/s of the AsyncLLM with in-process consumers only (no HTTP)."""
    llm = AsyncLLM(engine)
    from folio.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA)

    async def one(i: int) -> None:
        async for _ in llm.generate({"prompt_token_ids": [1, 2, 3]}, params, f"r{i}"):
            pass

    async def main() -> float:
        llm.start()
        start, steps = time.perf_counter(), engine.steps
        await asyncio.gather(*(one(i) for i in range(streams)))
        rate = (engine.steps - steps) / (time.perf_counter() - start)
        await llm.shutdown()
        return rate

    return asyncio.run(main())


def run_http(llm: AsyncLLM, engine_steps, streams: int, max_tokens: int) -> tuple[float, float]:
    """Steps/s and event-loop CPU share serving `streams` HTTP streaming clients."""
    from tests.server.harness import ServerThread

    with ServerThread(llm) as server:
        loop_tid = server._thread.native_id
        before_cpu, steps = _thread_cpu(loop_tid), engine_steps()
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", CLIENT, "127.0.0.1", str(server.port), str(streams), str(max_tokens)],
                       check=True)
        wall = time.perf_counter() - start
        loop_cpu = _thread_cpu(loop_tid) - before_cpu
        return (engine_steps() - steps) / wall, loop_cpu / wall


def _thread_cpu(tid: int) -> float:
    with open(f"/proc/{os.getpid()}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--python-ms", type=float, default=4.0)
    parser.add_argument("--device-ms", type=float, default=10.0)
    parser.add_argument("--switch-intervals", default="0.005,0.001")
    args = parser.parse_args()
    ideal = 1e3 / (args.python_ms + args.device_ms)
    tokenizer_dir = tempfile.mkdtemp(prefix="folio-measure-gil-")
    save_test_tokenizer(tokenizer_dir)
    make = functools.partial(StandInEngine, args.python_ms, args.device_ms, tokenizer_dir)
    for interval in (float(x) for x in args.switch_intervals.split(",")):
        sys.setswitchinterval(interval)
        alone = run_alone(make(), args.streams, args.max_tokens)
        engine = make()
        threaded, loop_share = run_http(AsyncLLM(engine), lambda: engine.steps, args.streams, args.max_tokens)
        print(json.dumps({"engine": "thread", "switch_interval_ms": interval * 1e3, "ideal_steps_s": round(ideal, 1),
                          "alone_steps_s": round(alone, 1), "http_steps_s": round(threaded, 1),
                          "http_vs_alone": round(threaded / alone, 3), "loop_cpu_share": round(loop_share, 3),
                          "streams": args.streams}), flush=True)
    llm = AsyncLLM(core=EngineProcess(make))
    separate, loop_share = run_http(llm, lambda: llm.metrics.num_steps, args.streams, args.max_tokens)
    print(json.dumps({"engine": "process", "ideal_steps_s": round(ideal, 1), "http_steps_s": round(separate, 1),
                      "loop_cpu_share": round(loop_share, 3), "streams": args.streams}), flush=True)

if __name__ == "__main__":
    main()
