"""Multi-LoRA throughput on W1: the base model vs one adapter vs N adapters round-robin.

    python scripts/bench_lora.py --config llama-3.1-8b --adapters 8 --rank 16 [--json out.json]

Random bf16 weights for the model (--load-format dummy) and random PEFT adapters written by this
script (rank --rank on all seven projections, saved as PEFT saves them: adapter_config.json +
adapter_model.safetensors). Runs in one process, one after the other:
  base          an engine without LoRA (enable_lora off): the reference figure;
  lora-none     the LoRA engine, no request uses an adapter (the cost of the wrappers alone);
  lora-1        the LoRA engine, every request under one adapter;
  lora-N        the LoRA engine, request i under adapter i % N (max_loras = N).
Each engine gets a short warm-up generate first; the clock covers generate only. Prefix caching
is off: the same W1 prompts run several times in one engine. --abba times
each mode twice in mirrored order (and base before and after) and reports the means: in one
session-6 call two runs of one configuration differed by 7%, first to last. Targets (issue 14):
lora-N >= 75% of base, lora-1 >= 90%.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from folio.benchmarks.throughput import release_device_memory  # noqa: E402
from folio.benchmarks.workloads import w1  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "folio", "benchmarks", "configs")
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_shapes(hf: dict) -> dict[str, tuple[str, int, int]]:
    """PEFT module -> (parent, in, out) for a Llama-shaped config."""
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hidden // heads
    kv = hf.get("num_key_value_heads") or heads
    inter = hf["intermediate_size"]
    return {
        "q_proj": ("self_attn", hidden, heads * head_dim), "k_proj": ("self_attn", hidden, kv * head_dim),
        "v_proj": ("self_attn", hidden, kv * head_dim), "o_proj": ("self_attn", heads * head_dim, hidden),
        "gate_proj": ("mlp", hidden, inter), "up_proj": ("mlp", hidden, inter), "down_proj": ("mlp", inter, hidden),
    }


def write_random_adapter(path: str, hf: dict, rank: int, seed: int) -> str:
    """A PEFT LoRA folder with random A and B (bf16) on every projection of every layer."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(MODULES),
              "bias": "none", "use_rslora": False, "lora_dropout": 0.0}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(hf["num_hidden_layers"]):
        for name, (parent, fan_in, fan_out) in module_shapes(hf).items():
            key = f"base_model.model.model.layers.{layer}.{parent}.{name}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=gen) / fan_in**0.5).bfloat16()
            tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=gen) * 0.01).bfloat16()
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    return path


def timed_generate(llm, workload, loras) -> dict:
    import torch
    from folio import SamplingParams

    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in workload.requests]
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=r.output_len) for r in workload.requests]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    sync()
    seconds = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    expected = sum(r.output_len for r in workload.requests)
    return {"seconds": seconds, "output_tokens": produced, "output_tok_s": produced / seconds, "complete": produced == expected}


def warm_up(llm, loras_for) -> None:
    """Short prompts (decode-sized kernels), then a batch of 2,400 prompt tokens: the LoRA
    kernels pick other tiles past 1,024 tokens, and W1's prefill steps would otherwise compile
    them inside the clock of whichever mode runs first."""
    from folio import SamplingParams

    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for n, length in ((8, 64), (8, 300)):
        prompts = [{"prompt_token_ids": list(range(100, 100 + length))} for _ in range(n)]
        llm.generate(prompts, params, use_tqdm=False, lora_request=loras_for(n))


def profile_kernels(llm, workload, loras, top: int) -> None:
    """torch.profiler over one generate: device time per kernel, the biggest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        timed_generate(llm, workload, loras)
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    total = sum(e.self_device_time_total for e in events)
    print(f"  device busy {total / 1e3:.1f} ms")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"  {e.self_device_time_total / 1e3:9.1f} ms {e.self_device_time_total / total:6.1%} {e.count:7d}x  {e.key[:80]}")
    if cuda:
        torch.cuda.synchronize()


def run_base(common: dict, workload) -> dict:
    """The base model's W1 (an engine without LoRA), after its warm-up."""
    from folio import LLM

    llm = LLM(**common)
    warm_up(llm, lambda n: None)
    result = timed_generate(llm, workload, None)
    print("base", result, flush=True)
    del llm
    release_device_memory()
    return result


def write_adapters(hf: dict, args) -> list:
    """args.adapters random PEFT folders of rank args.rank, as LoRARequests (ids 1..N)."""
    from folio import LoRARequest

    root = tempfile.mkdtemp(prefix="folio-lora-bench-")
    start = time.perf_counter()
    adapters = [LoRARequest(f"adapter{i}", i + 1, write_random_adapter(os.path.join(root, f"a{i}"), hf, args.rank, i))
                for i in range(args.adapters)]
    print(f"wrote {args.adapters} adapters of rank {args.rank} in {time.perf_counter() - start:.1f} s", flush=True)
    return adapters


def run_lora(common: dict, adapters: list, args, workload, order: list[str], stacked: str = "auto",
             label: str = "") -> list[tuple[str, dict]]:
    """One LoRA engine (FOLIO_LORA_STACKED=stacked while it is built): each mode warmed up,
    then timed in `order` (modes may repeat); results named label + mode."""
    from folio import LLM

    with mock.patch.dict(os.environ, {"FOLIO_LORA_STACKED": stacked}):
        llm = LLM(**common, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank)
    wrappers = llm.llm_engine.runner.lora.layers  # counted, not kept: a reference would keep the model alive
    print(f"{label or 'lora'} engine: A stacked under the base weight in "
          f"{sum(w.stacked_weight is not None for w in wrappers.values())} of {len(wrappers)} layers", flush=True)
    del wrappers
    per_mode = {
        "lora-none": lambda n: None,
        "lora-1": lambda n: [adapters[0]] * n,
        "lora-N": lambda n: [adapters[i % len(adapters)] for i in range(n)],
    }
    for mode in dict.fromkeys(order):
        warm_up(llm, per_mode[mode])
    timed = []
    for mode in order:
        timed.append((label + mode, timed_generate(llm, workload, per_mode[mode](len(workload.requests)))))
        print(label + mode, timed[-1][1], flush=True)
    if args.profile:
        head = workload.head(args.profile)
        for mode in dict.fromkeys(order):
            print(f"##### kernels of {mode}, the first {args.profile} requests of W1", flush=True)
            profile_kernels(llm, head, per_mode[mode](len(head.requests)), top=16)
    del llm
    release_device_memory()
    return timed


def combine(runs: list[dict]) -> dict:
    """One mode's runs: mean tokens/s, each run kept."""
    return {"output_tok_s": sum(r["output_tok_s"] for r in runs) / len(runs), "runs": runs,
            "complete": all(r["complete"] for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="llama-3.1-8b", help="a folder under folio/benchmarks/configs")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=None, help="the first N requests of W1 (default: all 256)")
    parser.add_argument("--modes", default="base,lora-none,lora-1,lora-N")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", type=int, default=0, help="then each LoRA mode's kernels over this many W1 requests")
    parser.add_argument("--abba", action="store_true",
                        help="each LoRA mode timed twice, in order then reversed, and base before and after: "
                             "a drift over the run (clocks, heat) then weighs on every mode alike")
    parser.add_argument("--unstacked", action="store_true",
                        help="then a second LoRA engine with FOLIO_LORA_STACKED=0 (the shrink kernel), lora-1 and "
                             "lora-N once each: the same-run A/B of the stacked layout")
    args = parser.parse_args()

    model = os.path.join(CONFIGS, args.config)
    with open(os.path.join(model, "config.json")) as f:
        hf = json.load(f)
    workload = w1() if args.num_prompts is None else w1().head(args.num_prompts)
    modes = args.modes.split(",")
    # Prefix caching off: W1 fits the 8B's KV cache whole, so a mode timed again (--abba) would
    # find its prompts cached from its first run (session 7: lora-N's second run 8,789 tok/s,
    # its first 7,214) and a mode after another sharing an adapter would find part of them.
    common = dict(model=model, load_format="dummy", dtype="bfloat16", max_model_len=args.max_model_len,
                  enable_prefix_caching=False)
    runs: dict[str, list[dict]] = {}  # mode -> its timed runs
    if "base" in modes:
        runs["base"] = [run_base(common, workload)]
    lora_modes = [m for m in modes if m.startswith("lora-")]
    adapters = write_adapters(hf, args) if lora_modes or args.unstacked else []
    if lora_modes:
        order = lora_modes + lora_modes[::-1] if args.abba else lora_modes
        for mode, result in run_lora(common, adapters, args, workload, order):
            runs.setdefault(mode, []).append(result)
    if args.unstacked:
        for mode, result in run_lora(common, adapters, args, workload, ["lora-1", "lora-N"], stacked="0",
                                     label="unstacked-"):
            runs.setdefault(mode, []).append(result)
    if "base" in modes and args.abba:
        runs["base"].append(run_base(common, workload))
    results = {mode: combine(mode_runs) for mode, mode_runs in runs.items()}
    if "base" in results:
        for mode, r in results.items():
            r["fraction_of_base"] = r["output_tok_s"] / results["base"]["output_tok_s"]
    print(f"\n{'mode':<16} {'output tok/s':>13} {'of base':>8}")
    for mode, r in results.items():
        print(f"{mode.replace('-N', f'-{args.adapters}'):<16} {r['output_tok_s']:>13,.0f} {r.get('fraction_of_base', 0):>8.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "adapters": args.adapters, "rank": args.rank,
                       "num_requests": len(workload.requests), "results": results}, f, indent=2)
    return 0 if all(r["complete"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
