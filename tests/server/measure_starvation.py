"""Does HTTP work starve the engine? The same workload three ways, engine steps/s and tokens/s.

    python -m tests.server.measure_starvation [--model PATH] [--requests 64] [--max-tokens 256]

1. offline: LLM.generate, the engine stepping alone;
2. async: AsyncLLM in this process, one asyncio consumer per request (the thread hand-off, no HTTP);
3. http-thread / http-process: the real server in a child process (its engine on a thread, or
   in a process of its own), one streaming HTTP client per request from this process (the
   clients do not share the server's GIL, as real clients would not).

Every request has a random token prompt (32..128 tokens, random.seed(0)), greedy sampling,
ignore_eos and the same max_tokens, so all three generate exactly the same tokens. For the
server, steps and time inside steps come from its /metrics (folio:engine_steps_total,
folio:engine_step_seconds_total): "busy" is the fraction of the wall time the engine thread
spent inside step(); the rest is what hand-off and HTTP cost it. CPU seconds per step come from
/proc: the engine thread's (which a busy machine does not inflate the way it inflates wall
time) and the event loop's (what HTTP work takes from the same GIL). Not a test: numbers vary
with the machine, and are written to docs/serving.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

import httpx


def workload(n: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(32, 128))] for _ in range(n)]


def report(name: str, wall: float, tokens: int, steps: float, step_seconds: float, engine_cpu: float,
           loop_cpu: float | None = None) -> dict:
    row = {"mode": name, "wall_s": round(wall, 2), "output_tok_s": round(tokens / wall, 1),
           "steps_s": round(steps / wall, 1), "busy": round(step_seconds / wall, 3),
           "engine_cpu_ms_per_step": round(1e3 * engine_cpu / steps, 2)}
    if loop_cpu is not None:
        row["loop_cpu_ms_per_step"] = round(1e3 * loop_cpu / steps, 2)
    print(json.dumps(row), flush=True)
    return row


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def split_cpu(before: dict[int, float], after: dict[int, float], main_tid: int) -> tuple[float, float]:
    """(engine thread, event loop) CPU seconds: the loop is the main thread, the engine the
    busiest of the others (torch's worker threads are the rest)."""
    cpu = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop = cpu.pop(main_tid, 0.0)
    return max(cpu.values(), default=0.0), loop


# ---- 1. offline -----------------------------------------------------------------------------------


def run_offline(engine_kwargs: dict, prompts: list[list[int]], max_tokens: int) -> dict:
    from folio import LLM, SamplingParams

    llm = LLM(**engine_kwargs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params, use_tqdm=False)  # warm up
    engine, steps, busy, cpu = llm.llm_engine, [0], [0.0], [0.0]
    step = engine.step

    def counted_step():
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return step()
        finally:
            steps[0] += 1
            busy[0] += time.perf_counter() - start
            cpu[0] += time.thread_time() - start_cpu

    engine.step = counted_step
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return report("offline", wall, tokens, steps[0], busy[0], cpu[0])


# ---- 2. AsyncLLM without HTTP ---------------------------------------------------------------------


def run_async(engine_kwargs: dict, prompts: list[list[int]], max_tokens: int) -> dict:
    from folio import SamplingParams
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.async_llm import AsyncLLM
    from folio.sampling_params import RequestOutputKind

    llm = AsyncLLM.from_engine_args(EngineArgs(**engine_kwargs))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)

    async def one(i: int, prompt: list[int]) -> int:
        tokens = 0
        async for output in llm.generate({"prompt_token_ids": prompt}, params, f"r{i}"):
            tokens += sum(len(c.token_ids) for c in output.outputs)
        return tokens

    async def main() -> dict:
        llm.start()
        await asyncio.gather(*(one(-i - 1, p) for i, p in enumerate(prompts[:4])))  # warm up
        steps0, busy0, cpu0 = llm.metrics.num_steps, llm.metrics.busy_seconds, thread_cpu(os.getpid())
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
        wall = time.perf_counter() - start
        steps = llm.metrics.num_steps - steps0
        busy = llm.metrics.busy_seconds - busy0
        engine_cpu, loop_cpu = split_cpu(cpu0, thread_cpu(os.getpid()), threading.main_thread().native_id)
        await llm.shutdown()
        return report("async", wall, tokens, steps, busy, engine_cpu, loop_cpu)

    return asyncio.run(main())


# ---- 3. the HTTP server -----------------------------------------------------------------------------


def start_server(engine_kwargs: dict, engine_process: bool) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "folio.entrypoints.openai.api_server", "--port", "0",
           "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning",
           "--engine-process" if engine_process else "--no-engine-process"]
    for key, value in engine_kwargs.items():
        if value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "FOLIO_API_KEY": ""})
    url: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        for line in proc.stderr:
            match = re.search(r"on (http://[\d.]+:\d+)/v1", line)
            if match and not url:
                url.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait()
    if not url:
        raise RuntimeError("the server did not start")
    while True:
        try:
            if httpx.get(f"{url[0]}/health").status_code == 200:
                return proc, url[0]
        except httpx.TransportError:
            time.sleep(0.1)


def scrape(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        match = re.match(r"(folio:engine_step(?:s|_seconds)_total)\{.*\} (\S+)", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def _children(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return children


def _engine_cpu(pid: int) -> float:
    """CPU seconds of the busiest child process's main thread: the engine process's loop, when
    the server has one (multiprocessing may also start a resource tracker)."""
    return max((thread_cpu(child).get(child, 0.0) for child in _children(pid)), default=0.0)


def run_http(engine_kwargs: dict, prompts: list[list[int]], max_tokens: int, engine_process: bool) -> dict:
    proc, url = start_server(engine_kwargs, engine_process)

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> int:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        tokens = 0
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
        return tokens

    async def main() -> dict:
        limits = httpx.Limits(max_connections=len(prompts) + 8)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            await asyncio.gather(*(one(client, p) for p in prompts[:4]))  # warm up
            before, cpu_before = scrape(url), thread_cpu(proc.pid)
            engine_before = _engine_cpu(proc.pid)
            start, client_start = time.perf_counter(), time.process_time()
            tokens = sum(await asyncio.gather(*(one(client, p) for p in prompts)))
            wall, client_cpu = time.perf_counter() - start, time.process_time() - client_start
            after, cpu_after = scrape(url), thread_cpu(proc.pid)
            engine_after = _engine_cpu(proc.pid)
        steps = after["folio:engine_steps_total"] - before["folio:engine_steps_total"]
        busy = after["folio:engine_step_seconds_total"] - before["folio:engine_step_seconds_total"]
        name = "http-process" if engine_process else "http-thread"
        if engine_process:  # the engine's loop is the child process's main thread
            engine_cpu, loop_cpu = engine_after - engine_before, split_cpu(cpu_before, cpu_after, proc.pid)[1]
        else:
            engine_cpu, loop_cpu = split_cpu(cpu_before, cpu_after, proc.pid)
        row = report(name, wall, tokens, steps, busy, engine_cpu, loop_cpu)
        print(json.dumps({"clients_cpu_ms_per_step": round(1e3 * client_cpu / steps, 2)}), flush=True)
        return row

    try:
        return asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the demo model)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--modes", default="offline,async,http-thread,http-process")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the best of each mode is summarized")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (OMP_NUM_THREADS) in every mode; on a small shared "
                             "machine, spinning OpenMP workers make timings erratic")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch is imported; the server inherits it
    engine_kwargs = {"model": args.model, "device": "cpu", "dtype": "float32", "max_model_len": args.max_model_len}
    from folio.engine.arg_utils import EngineArgs

    vocab = EngineArgs(**engine_kwargs).create_engine_config().model.vocab_size
    prompts = workload(args.requests, vocab)
    runners = {
        "offline": run_offline,
        "async": run_async,
        "http-thread": functools.partial(run_http, engine_process=False),
        "http-process": functools.partial(run_http, engine_process=True),
    }
    best: dict[str, dict] = {}
    for _ in range(args.repeat):  # interleaved, so a burst of load elsewhere hits every mode alike
        for mode in args.modes.split(","):
            row = runners[mode](engine_kwargs, prompts, args.max_tokens)
            if mode not in best or row["steps_s"] > best[mode]["steps_s"]:
                best[mode] = row
    print("best of", args.repeat, flush=True)
    for row in best.values():
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
