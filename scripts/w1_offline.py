"""W1 through the offline engine on a real architecture with dummy weights, for the GPU fast path.

Not the user-facing benchmark (that is `folio bench throughput`): this drives LLMEngine step by
step so it can also record the step timeline and a profiler window.

    PYTHONPATH=. python scripts/w1_offline.py --out DIR [--enforce-eager] [--timeline]
        [--profile-steps 200:210] [--config qwen3-0.6b] [--modes async,sync]

Prints output tok/s and checks that every request produced exactly its max_tokens tokens.
--modes: W1 once per scheduling mode, one after the other on the same engine (async: the next
step is launched before this one's tokens are back; sync: --no-async-scheduling).
--timeline: CUDA events on the stream before each step's forward (after its batch is built) and
after its last device work (sampling and the copies to the host). "in step" = the step's GPU
time; "gap" = end of step N to the start of step N+1's forward on the GPU: the GPU idles (sync
mode: engine bookkeeping, scheduling, batch building; async mode: only what the host could not
hide behind the step before, plus the next step's input copies). "wait" = host time blocked on
a step's results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

CONFIGS = {
    "qwen3-0.6b": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False, head_dim=128,
        hidden_act="silu", hidden_size=1024, intermediate_size=3072, max_position_embeddings=40960,
        max_window_layers=28, num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=8,
        rms_norm_eps=1e-6, rope_scaling=None, rope_theta=1000000, sliding_window=None,
        tie_word_embeddings=True, torch_dtype="bfloat16", use_sliding_window=False, vocab_size=151936,
        bos_token_id=151643, eos_token_id=151645,
    ),
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False, head_dim=128,
        hidden_act="silu", hidden_size=4096, intermediate_size=14336, max_position_embeddings=131072,
        num_attention_heads=32, num_hidden_layers=32, num_key_value_heads=8, rms_norm_eps=1e-5,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
        rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16", vocab_size=128256,
        bos_token_id=128000, eos_token_id=128001,
    ),
}


def w1(num_requests: int = 256) -> tuple[list[list[int]], list[int]]:
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(num_requests)]
    out_lens = [random.randint(100, 1024) for _ in range(num_requests)]
    return prompts, out_lens


class Timeline:
    """CUDA events at each forward launch (after the batch is built) and each step's end, and
    host time per engine part (perf_counter around scheduler, runner build, output processor)."""

    def __init__(self, engine, tag: str) -> None:
        self.tag = tag
        runner = engine.runner
        self.steps: list[tuple[torch.cuda.Event, torch.cuda.Event, int, int, int]] = []
        self.host = {"schedule": 0.0, "update_from_output": 0.0, "process_outputs": 0.0, "build": 0.0,
                     "launch": 0.0, "wait": 0.0}
        self._launch: torch.cuda.Event | None = None
        launch = self._time(runner, "launch")
        self._time(engine.scheduler, "schedule")
        self._time(engine.scheduler, "update_from_output")
        self._time(engine.output_processor, "process_outputs")
        build = self._time(runner.inputs, "build")
        from folio.worker.pending_output import PendingOutput

        self._restore = (PendingOutput, PendingOutput.result)
        result = PendingOutput.result
        host = self.host

        def timed_result(pending):
            start = time.perf_counter()
            try:
                return result(pending)
            finally:
                host["wait"] += time.perf_counter() - start

        PendingOutput.result = timed_result

        def timed_build(*args, **kwargs):
            inputs = build(*args, **kwargs)
            self._launch = _event()
            return inputs

        def timed_launch(so):
            self._launch = None
            pending = launch(so)
            if self._launch is not None:
                context = sum(s.num_computed_tokens + s.num_new_tokens for s in so.scheduled)
                self.steps.append((self._launch, _event(), len(so.scheduled), so.total_num_scheduled_tokens, context))
            return pending

        runner.inputs.build, runner.launch = timed_build, timed_launch

    def close(self) -> None:
        cls, result = self._restore
        cls.result = result

    def _time(self, obj, name: str):
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.host[name] += time.perf_counter() - start

        setattr(obj, name, timed)
        return timed

    def summary(self, out: str | None) -> dict:
        torch.cuda.synchronize()
        in_step = [a.elapsed_time(b) for a, b, *_ in self.steps]
        gaps = [0.0] + [b.elapsed_time(a2) for (_, b, *_), (a2, *_) in zip(self.steps, self.steps[1:])]
        decode = [t for t, (_, _, n, tok, _) in zip(in_step, self.steps) if n == tok]
        if out:
            rows = [dict(seqs=n, tokens=tok, context=c, in_step_ms=round(t, 3), gap_before_ms=round(g, 3))
                    for (_, _, n, tok, c), t, g in zip(self.steps, in_step, gaps)]
            with open(os.path.join(out, f"steps-{self.tag}.json"), "w") as f:
                json.dump(rows, f)
        return {
            "steps": len(self.steps),
            "decode_steps": len(decode),
            "in_step_total_s": round(sum(in_step) / 1e3, 3),
            "gap_total_s": round(sum(gaps) / 1e3, 3),
            "gap_median_ms": round(statistics.median(gaps), 3) if gaps else 0.0,
            "decode_in_step_median_ms": round(statistics.median(decode), 3) if decode else 0.0,
            "mixed_in_step_total_s": round((sum(in_step) - sum(decode)) / 1e3, 3),
            "host_s": {k: round(v, 3) for k, v in self.host.items()},
        }


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def run(args: argparse.Namespace) -> list[dict]:
    from folio import LLM, SamplingParams
    from folio.kernels.triton_compat import set_triton_kernels

    if args.no_triton_kernels:
        set_triton_kernels(False)
    folder = tempfile.mkdtemp(prefix="folio-w1-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIGS[args.config], f)
    start = time.perf_counter()
    llm = LLM(
        model=folder, load_format="dummy", dtype="bfloat16", enforce_eager=args.enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
        attention_backend=args.attention_backend,
        **({"quantization": args.quantization} if args.quantization else {}),
        **({"kv_cache_dtype": args.kv_cache_dtype} if args.kv_cache_dtype else {}),
    )
    startup = time.perf_counter() - start
    engine = llm.llm_engine
    llm.generate([{"prompt_token_ids": [1] * 300}] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    results = []
    for mode in args.modes.split(","):
        engine.async_scheduling = mode == "async"
        result = run_w1(args, engine, mode)
        result["startup_s"] = round(startup, 2)
        print(json.dumps(result, indent=1), flush=True)
        results.append(result)
    return results


def run_w1(args: argparse.Namespace, engine, mode: str) -> dict:
    from folio import SamplingParams
    from folio.sampling_params import RequestOutputKind

    prompts, out_lens = w1(args.num_requests)
    # LLM.generate asks for FINAL_ONLY outputs; --output-kind cumulative streams every step's.
    kind = RequestOutputKind.FINAL_ONLY if args.output_kind == "final" else RequestOutputKind.CUMULATIVE
    for i, (prompt, n) in enumerate(zip(prompts, out_lens)):
        params = SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n, output_kind=kind)
        engine.add_request(f"w1-{i}", {"prompt_token_ids": prompt}, params)
    tag = ("eager" if args.enforce_eager else "graphs") + ("-gc" if args.gc_freeze else "") + f"-{mode}"
    tag += f"-{args.quantization}" if args.quantization else ""
    tag += f"-kv{args.kv_cache_dtype}" if args.kv_cache_dtype else ""
    timeline = Timeline(engine, f"{args.config}-{tag}") if args.timeline else None
    lo, hi = (int(x) for x in args.profile_steps.split(":")) if args.profile_steps else (-1, -1)
    profiler, finished, step = None, {}, 0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    preemptions = engine.scheduler.num_preemptions
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        if step == lo:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            profiler.__enter__()
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = len(output.outputs[0].token_ids)
        step += 1
        if step == hi and profiler is not None:
            profiler.__exit__(None, None, None)
            _save_profile(profiler, args.out, tag)
            profiler = None
    elapsed = time.perf_counter() - start
    if profiler is not None:  # HI past the last step: the profile ends with the run
        profiler.__exit__(None, None, None)
        _save_profile(profiler, args.out, tag)
    wrong = [i for i, n in enumerate(out_lens) if finished.get(f"w1-{i}") != n]
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "config": args.config,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "scheduling": mode,
        "enforce_eager": args.enforce_eager,
        "triton_kernels": not args.no_triton_kernels,
        "output_kind": args.output_kind,
        "gc_freeze": args.gc_freeze,
        "elapsed_s": round(elapsed, 3),
        "steps": step,
        "output_tokens": sum(out_lens),
        "output_tok_per_s": round(sum(out_lens) / elapsed, 1),
        "total_tok_per_s": round((sum(out_lens) + sum(map(len, prompts))) / elapsed, 1),
        "requests_with_wrong_count": len(wrong),
        "num_blocks": engine.num_blocks,
        "preemptions": engine.scheduler.num_preemptions - preemptions,
    }
    if timeline is not None:
        timeline.close()
        result["timeline"] = timeline.summary(args.out)
        _untime(engine)
    return result


def _untime(engine) -> None:
    """Drop the Timeline's wrappers (instance attributes) so the next run starts clean."""
    for obj in (engine.runner, engine.runner.inputs, engine.scheduler, engine.output_processor):
        for name in ("launch", "build", "schedule", "update_from_output", "process_outputs"):
            obj.__dict__.pop(name, None)


def _save_profile(profiler, out: str | None, tag: str) -> None:
    table = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70)
    print(table)
    if out:
        with open(os.path.join(out, f"profile-{tag}.txt"), "w") as f:
            f.write(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen3-0.6b", choices=sorted(CONFIGS))
    parser.add_argument("--out", default=None, help="folder for result.json and profile.txt")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--no-triton-kernels", action="store_true", help="torch RMSNorm/rotary/SiLU")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument("--quantization", default=None, help="e.g. fp8 (online from the dummy bf16 weights)")
    parser.add_argument("--kv-cache-dtype", default=None, help="e.g. fp8")
    parser.add_argument("--profile-steps", default=None, help="LO:HI engine steps under torch.profiler")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--output-kind", default="final", choices=["final", "cumulative"])
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() before the run")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--modes", default="async", help="comma-separated: async, sync")
    args = parser.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    results = run(args)
    if args.out:
        with open(os.path.join(args.out, "result.json"), "a") as f:
            for result in results:
                f.write(json.dumps(result) + "\n")
    sys.exit(1 if any(r["requests_with_wrong_count"] for r in results) else 0)


if __name__ == "__main__":
    main()
