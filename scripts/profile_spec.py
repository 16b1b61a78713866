"""Where a batch-1 speculative step spends its time: cProfile of `generate` on the trained pair
(scripts/gpu_session.sh spec-pair), with counts of graph replays against eager forwards.

    python scripts/profile_spec.py --target /tmp/spec-pair/target --draft /tmp/spec-pair/draft
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections import Counter

from folio import LLM, SamplingParams
from folio.benchmarks.spec_decode import copy_prompts, plain_prompts


def count_calls(obj: object, name: str, counter: Counter, key: str) -> None:
    fn = getattr(obj, name)

    def wrapped(*a, **k):  # noqa: ANN002, ANN003, ANN202
        counter[key] += 1
        return fn(*a, **k)

    setattr(obj, name, wrapped)


def log_compiles() -> None:
    """Print every Triton compile that happens in the timed region, with where it came from."""
    import traceback

    import triton

    def hook(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        fn = kwargs.get("fn")
        name = getattr(getattr(fn, "jit_function", fn), "__name__", None) or repr(kwargs.get("repr"))[:120]
        stack = [f"{f.filename.split('folio/')[-1]}:{f.lineno}" for f in traceback.extract_stack() if "/folio/" in f.filename]
        print(f"TRITON COMPILE {name} key={str(kwargs.get('key'))[:200]} from {stack[-4:]}")
        return None

    triton.knobs.runtime.jit_cache_hook = hook


def profile(target: str, spec: dict | None, prompts: list[str], output_len: int, top: int) -> None:
    llm = LLM(model=target, speculative_config=spec, max_model_len=1024, gpu_memory_utilization=0.5, max_num_seqs=8)
    runner = llm.llm_engine.runner
    counter: Counter = Counter()
    if runner.graphs is not None:
        count_calls(runner.graphs, "replay", counter, "target graph replay")
    count_calls(runner.model, "forward", counter, "target eager forward")
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    counter.clear()
    if args_compiles:
        log_compiles()
    if gpu_profile:
        gpu_timeline(llm, prompts, params, spec)
        del llm
        return
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    tokens = 0
    for p in prompts:
        tokens += len(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids)
    prof.disable()
    seconds = time.perf_counter() - start
    print(f"\n##### spec={spec}: {tokens} tokens in {seconds:.3f} s = {tokens / seconds:.1f} tok/s; calls {dict(counter)}")
    for key in ("tottime",):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(top)
        print("\n".join(line[:160] for line in s.getvalue().splitlines()[6:]))
    del llm


args_compiles = True
gpu_profile = False


def gpu_timeline(llm, prompts: list[str], params: SamplingParams, spec: dict | None) -> None:  # noqa: ANN001
    """How much of the wall time the GPU was busy, and on what: torch.profiler's device time of
    every kernel and copy over the same requests (no cProfile: its overhead would hide gaps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        tokens = sum(len(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids) for p in prompts)
        sync()
    wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    busy_us = sum(e.self_device_time_total for e in events)
    print(f"\n##### GPU timeline, spec={spec}: {tokens} tokens in {wall:.3f} s (under the profiler); "
          f"device busy {busy_us / 1e3:.1f} ms = {busy_us / 1e4 / wall:.0f}% of the wall time")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:12]:
        print(f"  {e.self_device_time_total / 1e3:9.1f} ms  {e.count:7d}x  {e.key[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--gpu-timeline", action="store_true", help="torch.profiler device time instead of cProfile")
    args = parser.parse_args()
    global gpu_profile
    gpu_profile = args.gpu_timeline
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    draft = {"model": args.draft, "num_speculative_tokens": 4}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    copying = copy_prompts(args.prompts, lambda text: len(tokenizer(text).input_ids), 64)
    profile(args.target, None, copying, 64, args.top)  # the benchmark's copy-heavy rows: 64 tokens
    profile(args.target, ngram, copying, 64, args.top)
    profile(args.target, draft, plain_prompts(args.prompts), args.output_len, args.top)


if __name__ == "__main__":
    main()
