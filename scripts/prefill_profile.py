"""Where a long prompt's time to first token goes: device time by kernel of one prefill.

    python scripts/prefill_profile.py --model folio/benchmarks/configs/qwen3-0.6b --prompt-len 30000
    python scripts/prefill_profile.py --engine vllm ...   # the same for vLLM (FOLIO_VLLM_SITE)

Dummy bf16 weights, prefix caching off (every call prefills in full), one untimed call first
(compilation, autotuning); then `--repeat` timed calls (wall ms, median) and one call under
torch.profiler: each kernel's device ms per prompt, its launches and its share, and the sum by
kind (attention, GEMM, the rest), against the attention and GEMM floors at the measured matrix
rate given by --tflops. The timeline line splits the profiled call's wall time into the device's
busy time, the lead before its first kernel, the idle gaps between kernels and the tail after
the last: two marker kernels, launched on an idle device just before and after `generate`, stand
for the call's start and end on the device's clock. vLLM runs in a child process with its site
first on the path and its engine core in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the
profiler sees its kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

KINDS = (("other", ("reshape_and_cache",)),  # vLLM's cache write: named after flash attention's layout
         ("attention", ("prefill_attention", "unified_attention", "paged_decode", "flash")),
         ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "gemv", "scaled_mm")))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def floors(config: dict, n: int, tflops: float) -> tuple[float, float]:
    """(attention, linear layers) ms at `tflops` for one causal prompt of n tokens."""
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    dim = config.get("head_dim") or config["hidden_size"] // heads
    attention = 4 * heads * dim * n * n / 2 * layers
    h, inter, kv = config["hidden_size"], config["intermediate_size"], config.get("num_key_value_heads", heads)
    params = layers * (h * (heads + 2 * kv) * dim + heads * dim * h + 3 * h * inter)
    return attention / tflops / 1e9, 2 * params * n / tflops / 1e9


def idle_gaps(kernels: list[tuple]) -> tuple[list[tuple[int, int, str, str]], int | None]:
    """The idle gaps between device intervals (start_ns, end_ns[, name]), overlaps merged, as
    (start, end, the kernel before, the kernel after), and the end of the last interval."""
    gaps, cursor, before = [], None, ""
    for a, b, *name in sorted(kernels):
        label = name[0] if name else ""
        if cursor is not None and a > cursor:
            gaps.append((cursor, a, before, label))
        if cursor is None or b > cursor:
            cursor, before = b, label
    return gaps, cursor


def timeline(kernels: list[tuple[int, int]]) -> dict[str, float]:
    """ms of lead, busy, gaps and tail from device intervals (start_ns, end_ns) whose first and last
    are the markers around the call."""
    (_, start), *inner, (end, _) = sorted(kernels)
    if not inner:
        return {"lead": (end - start) / 1e6, "busy": 0.0, "gaps": 0.0, "tail": 0.0}
    gaps, last = idle_gaps(inner)
    idle = sum(b - a for a, b, _, _ in gaps)
    first = inner[0][0]
    return {"lead": (first - start) / 1e6, "busy": (last - first - idle) / 1e6, "gaps": idle / 1e6,
            "tail": (end - last) / 1e6}


def largest_gaps(kernels: list[tuple[int, int, str]], top: int) -> list[tuple[float, str, str]]:
    """The `top` longest idle gaps between kernels, the lead and tail next to the markers included:
    (ms, the kernel before, the kernel after)."""
    gaps, _ = idle_gaps(kernels)
    return sorted((((b - a) / 1e6, before, after) for a, b, before, after in gaps), reverse=True)[:top]


def engine(name: str, model: str, max_model_len: int):
    """(LLM, its SamplingParams) of folio or vLLM, dummy bf16 weights, prefix caching off."""
    if name == "folio":
        from folio import LLM, SamplingParams

        return LLM(model=model, load_format="dummy", dtype="bfloat16", max_model_len=max_model_len,
                   enable_prefix_caching=False), SamplingParams
    from vllm import LLM, SamplingParams

    return LLM(model=model, load_format="dummy", dtype="bfloat16", max_model_len=max_model_len,
               enable_prefix_caching=False, skip_tokenizer_init=True), SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("folio", "vllm"), default="folio")
    parser.add_argument("--model", required=True, help="a checkpoint folder (config.json is enough)")
    parser.add_argument("--prompt-len", type=int, default=30000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--host-profile", type=int, default=0, help="also print the N functions with the most "
                        "host time (cProfile, self time) of one more call")
    parser.add_argument("--tflops", type=float, default=709.0, help="measured bf16 matrix rate (TFLOP/s)")
    args = parser.parse_args()
    if args.engine == "vllm" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        from folio.benchmarks.vllm_peer import child_env

        env = dict(child_env(), VLLM_ENABLE_V1_MULTIPROCESSING="0")
        sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
    import torch
    from torch.profiler import ProfilerActivity, profile

    llm, sampling_params = engine(args.engine, args.model, args.prompt_len + 8)
    rng = random.Random(0)
    params = sampling_params(max_tokens=1, ignore_eos=True, detokenize=False)

    def once() -> float:
        ids = [rng.randrange(10000) for _ in range(args.prompt_len)]
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        return (time.perf_counter() - start) * 1e3

    once()
    wall = statistics.median(once() for _ in range(args.repeat))
    cuda = torch.cuda.is_available()
    marker = torch.zeros(1, device="cuda" if cuda else "cpu")
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        if cuda:
            torch.cuda.synchronize()
        marker.add_(1)
        once()
        marker.add_(1)
        if cuda:
            torch.cuda.synchronize()
    field = "self_device_time_total" if cuda else "self_cpu_time_total"  # the CPU: a smoke test only
    events = [e for e in prof.key_averages() if getattr(e, field) > 0]
    busy = sum(getattr(e, field) for e in events) / 1e3
    with open(os.path.join(args.model, "config.json")) as f:
        attention_floor, gemm_floor = floors(json.load(f), args.prompt_len, args.tflops)
    print(f"PREFILL {args.engine} {args.prompt_len} tokens: wall {wall:.1f} ms (median of {args.repeat}), device busy {busy:.1f} ms; "
          f"floors at {args.tflops:.0f} TFLOP/s: attention {attention_floor:.1f} ms, linear layers {gemm_floor:.1f} ms")
    if cuda:
        kernels = [(e.start_ns(), e.end_ns(), e.name()) for e in prof.profiler.kineto_results.events()
                   if e.device_type() == torch.autograd.DeviceType.CUDA]
        parts = timeline([k[:2] for k in kernels])
        print("PREFILL timeline of the profiled call: " + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items()))
        for ms, before, after in largest_gaps(kernels, 6):
            print(f"PREFILL gap {ms:7.2f} ms after {before[:60]} before {after[:60]}")
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + getattr(e, field) / 1e3
    print("PREFILL by kind: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for e in sorted(events, key=lambda e: -getattr(e, field))[: args.top]:
        ms = getattr(e, field) / 1e3
        print(f"PREFILL {ms:8.2f} ms {100 * ms / busy:5.1f}% {e.count:6d} calls {1e3 * ms / e.count:9.1f} us/call  "
              f"{e.key[:90]}")
    if args.host_profile:
        host_profile(once, args.host_profile)


def host_profile(call, top: int) -> None:
    """The host's self time by function over one call (time blocked on the device included)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(call)
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]  # (cc, nc, tottime, cumtime, callers)
    for (path, line, name), (_, calls, self_s, cum_s, _) in rows:
        print(f"PREFILL host {1e3 * self_s:8.2f} ms self {1e3 * cum_s:8.2f} ms cum {calls:7d} calls  "
              f"{os.path.basename(path)}:{line} {name}")


if __name__ == "__main__":
    main()
