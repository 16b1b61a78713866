"""Structured-output throughput: a workload with a JSON schema per request, beside the same
batch unconstrained, in one engine and one run.

Each request gets one of SCHEMA_VARIANTS schemas (same shape, different property names, so the
grammar cache holds several), greedy, EOS ignored, max_tokens its workload length; a grammar
may end a request earlier. The unconstrained run then asks each request for exactly the number
of tokens its structured run produced, so both runs generate the same tokens counts. Reported
beside the throughputs: grammar compile time (the first request of each schema, in the
warm-up), host milliseconds per engine step spent on grammar work (filling bitmasks and
accepting tokens), and device milliseconds to apply one step's mask at the run's batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from folio.benchmarks.result import RunResult
from folio.benchmarks.throughput import _prompts, _synchronize, release_device_memory
from folio.benchmarks.workloads import Workload
from folio.engine.arg_utils import EngineArgs

SCHEMA_VARIANTS = 8
STRUCTURED_KINDS = ("json-schema",)


def bench_schema(variant: int) -> dict[str, Any]:
    """A record-like schema whose strings and lists are unbounded, so long outputs fit it."""
    return {
        "type": "object",
        "properties": {
            f"id_{variant}": {"type": "integer"},
            f"title_{variant}": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
        },
        "required": [f"id_{variant}", f"title_{variant}", "tags", "score"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class StructuredRun:
    structured: RunResult
    unconstrained: RunResult
    compile_ms: float  # cold compile of one schema against the tokenizer, mean over the variants
    first_compile_ms: float  # the first schema's compile (nothing of it cached yet)
    backend_build_ms: float  # the backend's tokenizer tables: once per engine, built as it starts
    grammar_host_ms_per_step: float
    steps: int
    mask_device_ms: float | None  # one step's mask applied at the run's largest batch; None off CUDA

    def format_text(self) -> str:
        s, u = self.structured, self.unconstrained
        ratio = s.output_tok_s / u.output_tok_s if u.output_tok_s else 0.0
        device = f"{self.mask_device_ms:.3f} ms" if self.mask_device_ms is not None else "n/a (not CUDA)"
        return "\n".join([
            f"{'run':<32}{'requests':>10}{'output tokens':>15}{'seconds':>10}{'output tok/s':>14}",
            *(f"{r.system:<32}{r.num_requests:>10}{r.output_tokens:>15,}{r.elapsed_s:>10.2f}{r.output_tok_s:>14,.0f}" for r in (s, u)),
            f"structured / unconstrained: {ratio:.1%}",
            f"grammar work on the host: {self.grammar_host_ms_per_step:.3f} ms per step over {self.steps} steps",
            f"mask applied on the device: {device} per step",
            f"grammar compile, cold: {self.compile_ms:.1f} ms per schema (mean of {SCHEMA_VARIANTS} schemas, the first "
            f"{self.first_compile_ms:.1f} ms; cached after)",
            f"grammar backend build (vocabulary tables, once per engine, on a worker thread from engine start): "
            f"{self.backend_build_ms:.0f} ms",
        ])


def with_bench_tokenizer(engine_args: EngineArgs, model_path: str, vocab_size: int) -> tuple[EngineArgs, str | None]:
    """Grammars need a tokenizer: for a checkpoint without one (a dummy config), a synthetic
    one of the model's vocabulary size (benchmarks/bench_tokenizer.py); returns a note saying so."""
    import dataclasses
    import os
    import tempfile

    from folio.benchmarks.bench_tokenizer import build_bench_tokenizer
    from folio.transformers_utils.tokenizer import has_tokenizer_files

    if engine_args.tokenizer is not None or (os.path.isdir(model_path) and has_tokenizer_files(model_path)):
        return engine_args, None
    folder = tempfile.mkdtemp(prefix="folio-bench-tokenizer-")
    build_bench_tokenizer(vocab_size).save_pretrained(folder)
    note = f"the checkpoint has no tokenizer: a synthetic byte-level BPE of {vocab_size:,} tokens is used"
    return dataclasses.replace(engine_args, tokenizer=folder), note


def run_structured(engine_args: EngineArgs, workload: Workload, *, progress: bool = True) -> StructuredRun:
    from folio import LLM

    llm = LLM(**vars(engine_args))
    try:
        compile_ms, first_ms, build_ms = _warm_up(llm, workload)
        engine = llm.llm_engine
        timer = engine.structured_output.timer
        seconds_before, steps = timer.seconds, _count_steps(engine)
        structured, produced = _timed(llm, workload, _structured_params(workload), "folio structured (json-schema)", progress)
        host_ms = (timer.seconds - seconds_before) * 1000 / max(steps.count, 1)
        step_count = steps.count
        steps.stop()
        free_params = [_params(n) for n in produced]
        unconstrained, _ = _timed(llm, workload, free_params, "folio unconstrained", progress)
        mask_ms = _mask_device_ms(min(workload.num_requests, engine.config.scheduler.max_num_seqs), engine.config.model.vocab_size)
    finally:
        del llm
        release_device_memory()
    return StructuredRun(structured, unconstrained, compile_ms, first_ms, build_ms, host_ms, step_count, mask_ms)


def _params(max_tokens: int, schema: dict[str, Any] | None = None) -> Any:
    from folio import SamplingParams, StructuredOutputsParams

    constraint = None if schema is None else StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens, structured_outputs=constraint)


def _structured_params(workload: Workload) -> list[Any]:
    return [_params(r.output_len, bench_schema(i % SCHEMA_VARIANTS)) for i, r in enumerate(workload.requests)]


def _warm_up(llm: Any, workload: Workload) -> tuple[float, float, float]:
    """Compile every schema once, timed (ms per schema, cold; the first schema's; the backend's
    build, which the engine starts with itself and is not part of any schema's compile), then
    one short request per schema so the engine's grammar cache holds them all."""
    from folio.structured_output.spec import GrammarSpec

    params = [_params(8, bench_schema(i)) for i in range(SCHEMA_VARIANTS)]
    manager = llm.llm_engine.structured_output
    backend = manager.backend  # waits for the build begun at engine start
    times = []
    for p in params:
        start = time.perf_counter()
        backend.compile(GrammarSpec.from_params(p.structured_outputs))
        times.append((time.perf_counter() - start) * 1000)
    compile_ms = sum(times) / len(times)
    build_ms = 1000 * manager.backend_build_seconds[manager.default_backend_name]
    prompt = [{"prompt_token_ids": workload.requests[0].prompt_token_ids[:32]}] * SCHEMA_VARIANTS
    llm.generate(prompt, params, use_tqdm=False)
    return compile_ms, times[0], build_ms


def _timed(llm: Any, workload: Workload, params: list[Any], system: str, progress: bool) -> tuple[RunResult, list[int]]:
    _synchronize()
    start = time.perf_counter()
    outputs = llm.generate(_prompts(workload), params, use_tqdm=progress)
    _synchronize()
    elapsed = time.perf_counter() - start
    produced = [len(o.outputs[0].token_ids) for o in outputs]
    expected = Workload(workload.name, [type(r)(r.prompt_token_ids, p.max_tokens) for r, p in zip(workload.requests, params)])
    result = RunResult.measured(system, expected, produced, elapsed, prompt_tokens=workload.prompt_tokens)
    return result, produced


class _StepCounter:
    """Counts LLMEngine.step calls while installed."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.count = engine, 0
        self._step = engine.step
        engine.step = self._counted

    def _counted(self) -> Any:
        self.count += 1
        return self._step()

    def stop(self) -> None:
        del self.engine.step


def _count_steps(engine: Any) -> _StepCounter:
    return _StepCounter(engine)


def _mask_device_ms(batch: int, vocab_size: int, repeats: int = 50) -> float | None:
    """CUDA time of GrammarMask.apply on [batch, vocab] float32 logits, every row constrained."""
    import torch

    from folio.sample.grammar_mask import GrammarMask, bitmask_words

    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda")
    logits = torch.randn(batch, vocab_size, device=device)  # [batch, vocab]
    words = torch.randint(-(2**31), 2**31 - 1, (batch, bitmask_words(vocab_size)), dtype=torch.int32, device=device)
    mask = GrammarMask(torch.arange(batch, device=device), words)
    mask.apply(logits)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        mask.apply(logits)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats
