"""Offline throughput of folio on a workload: every request at once through `LLM.generate`.

Greedy sampling (or `temperature`, with no other truncation), EOS ignored, max_tokens = the request's output length, so every request must
produce exactly its length; the run checks that. The clock covers `generate` only (engine
start-up, weight loading and CUDA-graph capture are not in it), as in vLLM's
benchmark_throughput. A short warm-up generate runs first so that one-time JIT compilation of
kernels for shapes start-up did not meet is not timed either.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass
from typing import Any

from folio.benchmarks.result import RunResult
from folio.benchmarks.workloads import Workload, random_workload
from folio.engine.arg_utils import EngineArgs

SYSTEM = "folio"
_WARMUP_REQUESTS = 8
_WARMUP_PROMPT_LEN = 64
_WARMUP_OUTPUT_LEN = 8
# Then one prompt this long (at most), alone: the long-chunk prefill kernel runs only with few
# sequences in a step, so the short requests never compiled it and a fresh machine's first timed
# run did (session 21).
_WARMUP_LONG_PROMPT_LEN = 2048


@dataclass(frozen=True)
class FolioRun:
    result: RunResult
    subset_result: RunResult | None  # the same engine on the peers' subset, when there is one
    engine_stats: dict[str, Any]  # LLMEngine.stats() after the run, whatever fields it has
    model_path: str  # the resolved checkpoint folder, for the peers and the floor
    dtype: str  # the resolved dtype ("bfloat16", ...)
    device: str  # the resolved device ("cuda", "cpu")


def sampling_params_for(workload: Workload, detokenize: bool, temperature: float = 0.0) -> list[Any]:
    from folio import SamplingParams

    return [
        SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=r.output_len, detokenize=detokenize)
        for r in workload.requests
    ]


def run_folio(
    engine_args: EngineArgs,
    workload: Workload,
    *,
    subset: Workload | None = None,
    detokenize: bool = True,
    warmup: bool = True,
    progress: bool = True,
    temperature: float = 0.0,
) -> FolioRun:
    """Build the engine, run the workload once, report, and free the engine's device memory.

    With `subset` (the first requests the peers will run), the engine also runs those alone
    afterwards, so folio is compared with the peers on exactly the same requests.
    """
    from folio import LLM

    llm = LLM(**vars(engine_args))
    config = llm.llm_engine.config
    try:
        if warmup:
            _warm_up(llm, config, detokenize, temperature)
        result = _timed_generate(llm, workload, detokenize, progress, temperature)
        stats = _stats_dict(llm)
        subset_result = None
        if subset is not None and subset is not workload:
            subset_result = _timed_generate(llm, subset, detokenize, progress, temperature)
    finally:
        del llm
        release_device_memory()
    return FolioRun(result, subset_result, stats, config.model.model, config.model.dtype, config.device.device)


def warmup_workload(vocab_size: int) -> Workload:
    """The short untimed run before the timed one (one-time kernel compilation)."""
    return random_workload(
        _WARMUP_PROMPT_LEN, _WARMUP_OUTPUT_LEN, _WARMUP_REQUESTS,
        vocab_limit=min(vocab_size, 10001), seed=12345,
    )


def warmup_workloads(vocab_size: int, max_model_len: int) -> list[Workload]:
    """The untimed runs before the timed one (one-time kernel compilation), each a generate call
    of its own: 8 short requests, then a lone long prompt (cut to fit the context)."""
    long_len = min(_WARMUP_LONG_PROMPT_LEN, max_model_len - _WARMUP_OUTPUT_LEN)
    lone = [] if long_len < 1 else [random_workload(long_len, _WARMUP_OUTPUT_LEN, 1, vocab_limit=min(vocab_size, 10001),
                                                    seed=54321)]
    return [warmup_workload(vocab_size), *lone]


def _warm_up(llm: Any, config: Any, detokenize: bool, temperature: float) -> None:
    for warm in warmup_workloads(config.model.vocab_size, config.model.max_model_len):
        llm.generate(_prompts(warm), sampling_params_for(warm, detokenize, temperature), use_tqdm=False)


def _timed_generate(
    llm: Any, workload: Workload, detokenize: bool, progress: bool, temperature: float
) -> RunResult:
    prompts, params = _prompts(workload), sampling_params_for(workload, detokenize, temperature)
    _synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=progress)
    _synchronize()
    elapsed = time.perf_counter() - start
    produced = [len(o.outputs[0].token_ids) for o in outputs]
    return RunResult.measured(SYSTEM, workload, produced, elapsed,
                              prompt_tokens=sum(len(o.prompt_token_ids) for o in outputs),
                              notes=[] if detokenize else ["detokenization off"])


def _prompts(workload: Workload) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": r.prompt_token_ids} for r in workload.requests]


def _stats_dict(llm: Any) -> dict[str, Any]:
    stats = llm.llm_engine.stats()
    return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def release_device_memory() -> None:
    """Give cached GPU memory back so that the next system starts from an empty device."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def device_memory_in_use() -> int | None:
    """Bytes torch still holds on the GPU (None on the CPU): a leak check between systems."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.memory_allocated()
    return None
