"""W1's floor step by step, for the schedule folio and vLLM both run: every prompt first (at the
matrix rate), then decode steps with every unfinished request resident, each at max(its weight and
K/V bytes over the copy rate, its FLOPs over the matrix rate). Tighter than the benchmark's
whole-run floor (benchmarks/floor.py), and a floor of this schedule only: prompts hidden under
decode steps' spare compute would beat it. docs/perf-notes.md, "Session 28".

    python scripts/w1_step_floor.py [--copy-tb-s 3.0] [--tflop-s 785] [--measured qwen3-0.6b=19631,...]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from folio.benchmarks.floor import model_cost
from folio.benchmarks.workloads import w1

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "folio", "benchmarks", "configs")


def step_floor(name: str, copy: float, rate: float) -> tuple[float, float]:
    """(prompt seconds, decode seconds) of W1 on the config `name`, in bf16."""
    cost = model_cost(os.path.join(CONFIGS, name), "bfloat16")
    work = w1().requests
    prompts = np.array([r.prompt_len for r in work])
    outputs = np.array([r.output_len for r in work])
    pairs = float((prompts * (prompts + 1) / 2).sum())
    prompt_flops = 2 * cost.body_matmul_params * prompts.sum() + cost.attention_flops_per_pair * pairs
    decode = 0.0
    for k in range(1, int(outputs.max()) + 1):  # output token k of every request still running
        running = outputs >= k
        context = int((prompts[running] + k - 1).sum())
        n = int(running.sum())
        nbytes = cost.weight_bytes_per_step + (context + n) * cost.kv_bytes_per_token
        flops = 2 * (cost.body_matmul_params + cost.lm_head_params) * n + cost.attention_flops_per_pair * context
        decode += max(nbytes / copy, flops / rate)
    return prompt_flops / rate, decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copy-tb-s", type=float, default=3.0)
    parser.add_argument("--tflop-s", type=float, default=785.0)
    parser.add_argument("--measured", default="", help="name=tok/s,... to print as fractions of the floor")
    args = parser.parse_args()
    measured = dict(item.split("=") for item in args.measured.split(",") if item)
    outputs = sum(r.output_len for r in w1().requests)
    for name in ("qwen3-0.6b", "llama-3.1-8b"):
        prompt_s, decode_s = step_floor(name, args.copy_tb_s * 1e12, args.tflop_s * 1e12)
        ceiling = outputs / (prompt_s + decode_s)
        line = f"{name}: prompts {prompt_s:.2f} s, decode steps {decode_s:.2f} s, ceiling {ceiling:,.0f} tok/s"
        if name in measured:
            line += f"; {float(measured[name]):,.0f} tok/s = {float(measured[name]) / ceiling:.1%}"
        print(line)


if __name__ == "__main__":
    main()
