"""What watching the dashboard costs a serving engine: W1 output throughput with and without a watcher.

Against a running `folio serve` (no API key), the serving benchmark runs the workload `--rounds`
times unwatched and `--rounds` times watched, alternating (off, on, off, on, ...) so that drift
hits both sides alike. A watcher reads /v1/engine/state/stream?blocks=1 as the page does (~4
states a second, block map included) on a thread of this process. It prints each run's output
throughput, the mean of each side, the relative cost (the issue's bound: <= 1%), and what the
watcher received (states/s, bytes per state, how long a plain state read takes under load).

    folio serve Qwen/Qwen3-0.6B --port 8000 &
    python scripts/dashboard_cost.py --base-url http://127.0.0.1:8000 --model Qwen/Qwen3-0.6B
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx

from folio.benchmarks.serve import ServeOptions, run_serve_benchmark
from folio.benchmarks.workloads import make_workload


class Watcher:
    """Reads the state stream on a thread until stopped; counts states and bytes."""

    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url.rstrip('/')}/v1/engine/state/stream"
        self.states, self.bytes, self._stop = 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> Watcher:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(30)
        self.seconds = time.perf_counter() - self.started

    def _read(self) -> None:
        with httpx.stream("GET", self.url, params={"blocks": 1}, timeout=None) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.states += 1
                    self.bytes += len(line)
                if self._stop.is_set():
                    return


def time_state_read(base_url: str, reads: int = 20) -> float:
    """Median seconds of GET /v1/engine/state?blocks=1 (waits for the step in flight)."""
    times = []
    with httpx.Client(timeout=60) as client:
        for _ in range(reads):
            start = time.perf_counter()
            client.get(f"{base_url.rstrip('/')}/v1/engine/state", params={"blocks": 1}).raise_for_status()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3, help="runs per side (alternating)")
    parser.add_argument("--num-prompts", type=int, default=None, help="W1's first N requests (default: all 256)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    workload = make_workload("w1", num_prompts=args.num_prompts)
    options = ServeOptions(base_url=args.base_url, model=args.model, ready_timeout_s=600, progress=False)
    run_serve_benchmark(workload.head(min(16, workload.num_requests)), options)  # warm up
    results: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for watched in (False, True):
            if watched:
                with Watcher(args.base_url) as watcher:
                    run = run_serve_benchmark(workload, options)
                seen = (f"; watcher got {watcher.states / watcher.seconds:.1f} states/s, "
                        f"{watcher.bytes / max(1, watcher.states) / 1024:.1f} KiB each")
            else:
                run, seen = run_serve_benchmark(workload, options), ""
            if run.metrics.failed:
                raise SystemExit(f"{run.metrics.failed} requests failed: {run.metrics.errors[:3]}")
            results[watched].append(run.metrics.output_throughput)
            print(f"{'watched  ' if watched else 'unwatched'} {run.metrics.output_throughput:10.1f} output tok/s{seen}",
                  flush=True)
    off, on = statistics.mean(results[False]), statistics.mean(results[True])
    print(f"mean unwatched {off:.1f} tok/s, watched {on:.1f} tok/s: cost {100 * (off - on) / off:+.2f}% "
          f"(bound: 1%; spread of unwatched runs {100 * (max(results[False]) - min(results[False])) / off:.2f}%)")
    print(f"a state read with the block map takes {1000 * time_state_read(args.base_url):.2f} ms (median, idle)")


if __name__ == "__main__":
    main()
