"""Quantization benchmarks: perplexity of each scheme on held-out text, batch-1 decode latency,
and KV-cache blocks with an FP8 cache. Each configuration runs in its own process, so one
model's memory is gone before the next loads.

    python -m folio.benchmarks.quantization ppl [--model M] [--device cpu|cuda] [--dtype D]
    python -m folio.benchmarks.quantization decode --model folio/benchmarks/configs/llama-3.1-8b [--rounds 4]
    python -m folio.benchmarks.quantization kv-blocks --model folio/benchmarks/configs/llama-3.1-8b

ppl uses the demo model (trained locally, folio/demo) unless --model is given; held-out text is
the demo corpus drawn with another seed. Perplexity comes from prompt log-probs through
folio's public API (LLM.generate with prompt_logprobs=0), so it runs the engine's real path.
--rounds N runs the schemes N times in alternation (a process each) and reports each one's median:
the batch-1 token varies by ~2% between processes on one GPU (docs/perf-notes.md, session 15).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from typing import Any

# name -> LLM keyword arguments
SCHEMES: dict[str, dict[str, Any]] = {
    "baseline": {},
    "fp8": {"quantization": "fp8"},
    "int4-rtn": {"quantization": "int4-rtn"},
    "fp8-kv": {"kv_cache_dtype": "fp8"},
}


# ---- one configuration, in a child process ------------------------------------------------
def held_out_windows(tokenizer: Any, window: int, max_windows: int, seed: int) -> list[list[int]]:
    from folio.demo.corpus import pretraining_documents

    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for doc in pretraining_documents(seed):
        stream += tokenizer.encode(doc) + [eos]
    windows = [stream[i : i + window] for i in range(0, len(stream) - window, window)]
    return windows[:max_windows]


def measure_ppl(llm: Any, args: argparse.Namespace) -> dict[str, float]:
    from folio import SamplingParams

    windows = held_out_windows(llm.get_tokenizer(), args.window, args.max_windows, args.seed)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    total, count = 0.0, 0
    for window, out in zip(windows, outputs):
        for token, logprobs in zip(window[1:], out.prompt_logprobs[1:]):
            total -= logprobs[token].logprob
            count += 1
    return {"ppl": math.exp(total / count), "tokens": count}


def measure_decode(llm: Any, args: argparse.Namespace) -> dict[str, float]:
    """ms per output token at batch 1: (time for N + 1 tokens - time for 1) / N."""
    from folio import SamplingParams

    prompt = [{"prompt_token_ids": list(range(100, 100 + args.prompt_len))}]

    def timed(n: int) -> float:
        params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0)
        start = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)
        return time.perf_counter() - start

    timed(8)  # warm-up: compilation, CUDA graphs
    first = min(timed(1) for _ in range(3))
    full = min(timed(args.output_len + 1) for _ in range(3))
    if args.kernel_profile:
        print_kernel_profile(lambda: timed(args.kernel_profile + 1), args.kernel_profile, args.scheme)
    return {"ms_per_token": 1000 * (full - first) / args.output_len}


def print_kernel_profile(generate: Any, tokens: int, scheme: str, top: int = 16) -> None:
    """Device time per decode token by kernel (torch.profiler, graph replays included) of one
    generate of `tokens` tokens: where the batch-1 step's time goes (PROFILE lines on stdout,
    which run_all passes on)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        generate()
        if cuda:
            torch.cuda.synchronize()
    field = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, field, 0) > 0]
    busy = sum(getattr(e, field) for e in events) / tokens
    exposed = exposed_time(prof.events()) if cuda else {}
    print(f"PROFILE ##### {scheme}: device time per token {busy:.1f} us over {tokens} tokens "
          f"(exposed: {sum(exposed.values()) / tokens:.1f})", flush=True)
    for e in sorted(events, key=lambda e: -getattr(e, field))[:top]:
        per_token = getattr(e, field) / tokens
        print(f"PROFILE {per_token:8.1f} us/token {e.count / tokens:6.1f} calls/token "
              f"{getattr(e, field) / e.count:7.2f} us/call {exposed.get(e.key, 0.0) / tokens:8.1f} exposed  "
              f"{e.key[:80]}", flush=True)


def exposed_time(events: Any) -> dict[str, float]:
    """Per kernel name, the device time (us) by which it moved the end of the work so far: sorted
    by start, each kernel counts end - max(start, the latest end before it), or nothing. Under
    programmatic dependent launch a kernel starts while the one before it runs and its span
    includes that wait; this is its share of the critical path, and the shares add up to the
    device's busy wall time."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                   if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start)
    out: dict[str, float] = {}
    frontier = float("-inf")
    for start, end, name in spans:
        if end > frontier:
            out[name] = out.get(name, 0.0) + end - max(start, frontier)
            frontier = end
    return out


def run_one(args: argparse.Namespace) -> None:
    from folio import LLM
    from folio.demo.model import ensure_demo_model

    kwargs: dict[str, Any] = dict(SCHEMES[args.scheme])
    model = args.model or ensure_demo_model()
    if args.kind != "ppl":
        kwargs["load_format"] = "dummy"
    llm = LLM(model=model, device=args.device, dtype=args.dtype, seed=0, max_model_len=args.max_model_len, **kwargs)
    result: dict[str, Any] = {"scheme": args.scheme, "blocks": llm.llm_engine.num_blocks}
    if args.kind == "ppl":
        result |= measure_ppl(llm, args)
    elif args.kind == "decode":
        result |= measure_decode(llm, args)
    print("RESULT " + json.dumps(result), flush=True)


# ---- the table -------------------------------------------------------------------------------
def run_all(args: argparse.Namespace, schemes: list[str]) -> list[dict[str, Any]]:
    results = []
    for scheme in schemes:
        cmd = [sys.executable, "-m", "folio.benchmarks.quantization", args.kind, "--one", scheme]
        cmd += _forwarded(args)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        for line in proc.stdout.splitlines():
            if line.startswith("PROFILE "):
                print(line[len("PROFILE ") :], flush=True)
        if proc.returncode != 0 or not lines:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"{scheme} failed (exit {proc.returncode})")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
        print(json.dumps(results[-1]), flush=True)
    return results


def _forwarded(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len)]
    if args.model:
        out += ["--model", args.model]
    for name in ("window", "max_windows", "seed", "prompt_len", "output_len", "kernel_profile"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out


KEYS = {"ppl": "ppl", "decode": "ms_per_token", "kv-blocks": "blocks"}


def merge_rounds(kind: str, rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each scheme's result over rounds of run_all: its median, and every round's figure under
    "runs" (the decode token varies by ~2% from process to process on one GPU, so a ratio of two
    schemes is read from alternating processes, not one of each)."""
    key = KEYS[kind]
    merged = []
    for i, first in enumerate(rounds[0]):
        runs = [r[i][key] for r in rounds]
        merged.append({**first, key: statistics.median(runs), "runs": runs})
    return merged


def print_table(kind: str, results: list[dict[str, Any]]) -> None:
    base = results[0]
    key = KEYS[kind]
    rounds = len(base.get("runs", [base[key]]))
    label = f"median of {rounds}" if rounds > 1 else key
    print(f"\n| scheme | {label} | vs {base['scheme']} |" + (" runs |\n|---|---|---|---|" if rounds > 1 else "\n|---|---|---|"))
    for r in results:
        runs = " | " + ", ".join(f"{v:.4g}" for v in r["runs"]) + " |" if rounds > 1 else " |"
        print(f"| {r['scheme']} | {r[key]:.4g} | {r[key] / base[key]:.3f}x{runs}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["ppl", "decode", "kv-blocks"])
    parser.add_argument("--one", choices=sorted(SCHEMES), help=argparse.SUPPRESS)
    parser.add_argument("--schemes", default=None, help="comma-separated, from " + ", ".join(SCHEMES))
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--max-windows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="corpus seed of the held-out text (training used 0)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--kernel-profile", type=int, default=0, metavar="TOKENS",
                        help="decode: also print each kernel's device time per token over TOKENS tokens (GPU)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the schemes this many times, alternating, one process each; the table gives medians")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.one:
        args.scheme = args.one
        run_one(args)
        return 0
    defaults = {"ppl": "baseline,fp8,int4-rtn,fp8-kv", "decode": "baseline,int4-rtn,fp8", "kv-blocks": "baseline,fp8-kv"}
    schemes = (args.schemes or defaults[args.kind]).split(",")
    print_table(args.kind, merge_rounds(args.kind, [run_all(args, schemes) for _ in range(args.rounds)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
