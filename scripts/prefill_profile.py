"""Where a long prompt's time to first token goes: device time by kernel of one prefill.

    python scripts/prefill_profile.py --model folio/benchmarks/configs/qwen3-0.6b --prompt-len 30000

Dummy bf16 weights, prefix caching off (every call prefills in full), one untimed call first
(compilation, autotuning); then `--repeat` timed calls (wall ms, median) and one call under
torch.profiler: each kernel's device ms per prompt, its launches and its share, and the sum by
kind (attention, GEMM, the rest), against the attention and GEMM floors at the measured matrix
rate given by --tflops.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

KINDS = (("attention", ("prefill_attention", "unified_attention", "paged_decode", "flash")),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a checkpoint folder (config.json is enough)")
    parser.add_argument("--prompt-len", type=int, default=30000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--tflops", type=float, default=709.0, help="measured bf16 matrix rate (TFLOP/s)")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from folio import LLM, SamplingParams

    llm = LLM(model=args.model, load_format="dummy", dtype="bfloat16", max_model_len=args.prompt_len + 8,
              enable_prefix_caching=False)
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, ignore_eos=True)

    def once() -> float:
        ids = [rng.randrange(10000) for _ in range(args.prompt_len)]
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        return (time.perf_counter() - start) * 1e3

    once()
    wall = statistics.median(once() for _ in range(args.repeat))
    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        once()
        if cuda:
            torch.cuda.synchronize()
    field = "self_device_time_total" if cuda else "self_cpu_time_total"  # the CPU: a smoke test only
    events = [e for e in prof.key_averages() if getattr(e, field) > 0]
    busy = sum(getattr(e, field) for e in events) / 1e3
    with open(os.path.join(args.model, "config.json")) as f:
        attention_floor, gemm_floor = floors(json.load(f), args.prompt_len, args.tflops)
    print(f"PREFILL {args.prompt_len} tokens: wall {wall:.1f} ms (median of {args.repeat}), device busy {busy:.1f} ms; "
          f"floors at {args.tflops:.0f} TFLOP/s: attention {attention_floor:.1f} ms, linear layers {gemm_floor:.1f} ms")
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + getattr(e, field) / 1e3
    print("PREFILL by kind: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for e in sorted(events, key=lambda e: -getattr(e, field))[: args.top]:
        ms = getattr(e, field) / 1e3
        print(f"PREFILL {ms:8.2f} ms {100 * ms / busy:5.1f}% {e.count:6d} calls {1e3 * ms / e.count:9.1f} us/call  "
              f"{e.key[:90]}")


if __name__ == "__main__":
    main()
