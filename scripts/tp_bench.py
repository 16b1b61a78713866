"""Tensor parallelism on GPUs (issue 17): greedy equality TP2 vs TP1, W1 throughput, decode latency.

    python scripts/tp_bench.py equal  [--out DIR]           # TP2 == TP1 greedy, float32 and bf16
    python scripts/tp_bench.py decode --model CFG --tp N    # batch-1 decode ms/token
    python scripts/tp_bench.py w1     --model CFG --tp N    # `folio bench throughput` on W1
    python scripts/tp_bench.py all    [--out DIR]           # all of it on 2 GPUs (8B TP1/TP2, 70B TP2)

Every measurement runs in a fresh process (one engine per process, GPU memory returned between
runs). Weights are random (--load-format dummy) for throughput and latency. The equality check
writes a random safetensors checkpoint of the Llama-3.1-8B architecture with fewer layers (the
real widths, heads and vocabulary) and loads it at TP1 and TP2: dummy weights are drawn per
rank, so only a checkpoint gives both runs the same model. CUDA graphs stay on (decode replays
graphs that hold the NCCL all-reduce); NCCL_NVLS_ENABLE and the other multicast switches are
left as the machine sets them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "folio", "benchmarks", "configs")
LLAMA_8B = os.path.join(CONFIGS, "llama-3.1-8b")
LLAMA_70B = os.path.join(CONFIGS, "llama-3.1-70b")


# ---- a random checkpoint of a real architecture ---------------------------------------------
def write_random_checkpoint(path: str, base: str, num_layers: int, seed: int = 0) -> str:
    """Llama weights named as Hugging Face saves them, N(0, 0.02), norms 1 + N(0, 0.1)."""
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(base, "config.json")) as f:
        hf = json.load(f)
    hf["num_hidden_layers"] = num_layers
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    h, inter, vocab = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    d = hf.get("head_dim") or h // heads
    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: (torch.randn(*shape, generator=g, device="cuda") * 0.02).cpu()  # noqa: E731
    norm = lambda: (1 + torch.randn(h, generator=g, device="cuda") * 0.1).cpu()  # noqa: E731
    tensors = {"model.embed_tokens.weight": rand(vocab, h), "lm_head.weight": rand(vocab, h), "model.norm.weight": norm()}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": rand(heads * d, h), p + "self_attn.k_proj.weight": rand(kv * d, h),
            p + "self_attn.v_proj.weight": rand(kv * d, h), p + "self_attn.o_proj.weight": rand(h, heads * d),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
        })
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return path


# ---- one engine per process -------------------------------------------------------------------
def greedy(path: str, tp: int, dtype: str, out: str) -> None:
    import random

    from folio import LLM, SamplingParams

    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randint(0, 10000) for _ in range(n)]} for n in (7, 100, 513, 1000)]
    llm = LLM(model=path, dtype=dtype, tensor_parallel_size=tp, max_model_len=2048, max_num_seqs=8)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=1)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = [{"ids": list(o.outputs[0].token_ids),
               "logprobs": [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]}
              for o in outputs]
    llm.llm_engine.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


def decode(model: str, tp: int, out: str, steps: int = 256) -> None:
    """Batch-1 decode: (time of 1 + steps tokens - time of 1 token) / steps, after a warm-up."""
    from folio import LLM, SamplingParams

    llm = LLM(model=model, load_format="dummy", dtype="bfloat16", tensor_parallel_size=tp, max_model_len=4096)
    prompt = [{"prompt_token_ids": list(range(1000, 1128))}]
    run = lambda n: llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)  # noqa: E731
    run(steps + 1)  # warm-up
    timings = []
    for n in (1, steps + 1, 1, steps + 1):
        start = time.perf_counter()
        run(n)
        timings.append(time.perf_counter() - start)
    first = min(timings[0], timings[2])
    full = min(timings[1], timings[3])
    llm.llm_engine.shutdown()
    with open(out, "w") as f:
        json.dump({"model": model, "tp": tp, "ms_per_token": 1000 * (full - first) / steps}, f)


def _child(args: list[str], log: str, timeout: int = 1800) -> int:
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                              cwd=ROOT).returncode
    with open(log) as f:
        sys.stdout.write("".join(f.readlines()[-15:]))
    return code


# ---- the measurements ---------------------------------------------------------------------------
def check_equal(out_dir: str, layers: int) -> dict:
    # Not under out_dir: $OUT brings back small files only.
    path = write_random_checkpoint(os.path.join(os.environ.get("TMPDIR", "/tmp"), "tp-bench-ckpt"), LLAMA_8B, layers)
    found = {}
    for dtype in ("float32", "bfloat16"):
        for tp in (1, 2):
            target = os.path.join(out_dir, f"greedy-{dtype}-tp{tp}.json")
            code = _child([__file__, "_greedy", path, str(tp), dtype, target], target + ".log")
            found[(dtype, tp)] = json.load(open(target)) if code == 0 else None
    summary = {}
    for dtype in ("float32", "bfloat16"):
        one, two = found[(dtype, 1)], found[(dtype, 2)]
        if one is None or two is None:
            summary[dtype] = "failed (see logs)"
            continue
        prefixes = [_common_prefix(a["ids"], b["ids"]) for a, b in zip(one, two)]
        first_lp = max(abs(a["logprobs"][0] - b["logprobs"][0]) for a, b in zip(one, two))
        summary[dtype] = {"identical": all(a["ids"] == b["ids"] for a, b in zip(one, two)),
                          "common_prefix": prefixes, "of": len(one[0]["ids"]), "max_first_logprob_diff": first_lp}
    print(json.dumps(summary, indent=2))
    return summary


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure_decode(model: str, tp: int, out_dir: str) -> dict | None:
    target = os.path.join(out_dir, f"decode-{os.path.basename(model)}-tp{tp}.json")
    if _child([__file__, "_decode", model, str(tp), target], target + ".log") != 0:
        return None
    return json.load(open(target))


def measure_w1(model: str, tp: int, out_dir: str) -> dict | None:
    target = os.path.join(out_dir, f"w1-{os.path.basename(model)}-tp{tp}.json")
    args = ["-m", "folio", "bench", "throughput", "--model", model, "--load-format", "dummy",
            "--dtype", "bfloat16", "--tensor-parallel-size", str(tp), "--max-model-len", "4096",
            "--no-progress", "--json", target]
    if _child(args, target + ".log", timeout=3600) != 0:
        return None
    return json.load(open(target))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["equal", "decode", "w1", "all", "_greedy", "_decode"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--model", default=LLAMA_8B)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4, help="equal: layers of the random 8B-shaped checkpoint")
    parser.add_argument("--out", default=os.environ.get("OUT", "tp-bench-out"))
    a = parser.parse_args()
    if a.what == "_greedy":
        greedy(a.rest[0], int(a.rest[1]), a.rest[2], a.rest[3])
        return 0
    if a.what == "_decode":
        decode(a.rest[0], int(a.rest[1]), a.rest[2])
        return 0
    os.makedirs(a.out, exist_ok=True)
    results: dict = {}
    if a.what in ("equal", "all"):
        results["equal"] = check_equal(a.out, a.layers)
    if a.what == "decode":
        results["decode"] = [measure_decode(a.model, a.tp, a.out)]
    if a.what == "w1":
        results["w1"] = [measure_w1(a.model, a.tp, a.out)]
    if a.what == "all":
        results["decode"] = [measure_decode(LLAMA_8B, tp, a.out) for tp in (1, 2)]
        results["w1"] = [measure_w1(LLAMA_8B, tp, a.out) for tp in (1, 2)] + [measure_w1(LLAMA_70B, 2, a.out)]
    with open(os.path.join(a.out, "tp-bench.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(json.dumps(results.get("decode"), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
