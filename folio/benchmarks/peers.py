"""transformers on the same requests, in the same run: the peers folio is compared with.

Two ways transformers serves a batch of requests (DESIGN.md measured both on W1):
- continuous batching: `init_continuous_batching` (paged KV cache; sdpa attention, or flash when
  installed, which transformers switches to by itself), one `add_request` per request with its
  own `max_new_tokens`, EOS disabled, greedy;
- static `generate`: batches of 64 in workload order, left-padded, greedy; each batch runs until
  its longest request is done (min_new_tokens = max_new_tokens = that length, EOS disabled) and
  each request keeps its own length, so the tokens counted are the requested ones.

The model is built from the same checkpoint folder: `from_pretrained` for real weights, or
`from_config` with random weights for `--load-format dummy`. Each peer is timed without its
set-up (model build, cache allocation, CUDA-graph warm-up), as folio is. A peer that fails is
reported with its error instead of ending the run.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from folio.benchmarks.result import RunResult
from folio.benchmarks.throughput import release_device_memory
from folio.benchmarks.workloads import Workload

CB = "transformers continuous batching"
GENERATE = "transformers generate"
PEER_MODES = {"cb": CB, "generate": GENERATE}
DEFAULT_BATCH_SIZE = 64
_PAD_ID = 0  # any id works: padded positions are masked out
_RESULT_TIMEOUT_S = 600.0  # no result for this long: transformers' loop is stuck


@dataclass(frozen=True)
class PeerSpec:
    model_path: str
    dtype: str  # "bfloat16", "float16" or "float32"
    device: str  # "cuda" or "cpu"
    dummy_weights: bool
    seed: int = 0


def run_transformers(
    spec: PeerSpec,
    workload: Workload,
    *,
    modes: tuple[str, ...] = ("cb", "generate"),
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
) -> list[RunResult]:
    """Each requested mode on the workload, one model built for all of them, freed at the end."""
    try:
        model = build_model(spec)
    except Exception as e:  # noqa: BLE001 - a peer failure is reported, not raised
        return [RunResult.failed(PEER_MODES[m], workload.name, workload.num_requests, _describe(e)) for m in modes]
    results = []
    try:
        for mode in modes:
            runner = _run_continuous_batching if mode == "cb" else _run_generate
            kwargs = {"batch_size": batch_size} if mode == "generate" else {}
            try:
                results.append(runner(model, workload, progress=progress, **kwargs))
            except Exception as e:  # noqa: BLE001
                results.append(RunResult.failed(PEER_MODES[mode], workload.name, workload.num_requests, _describe(e)))
            release_device_memory()
    finally:
        del model
        release_device_memory()
    return results


def build_model(spec: PeerSpec) -> Any:
    import torch
    import transformers

    dtype = getattr(torch, spec.dtype)
    if not spec.dummy_weights:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            spec.model_path, dtype=dtype, attn_implementation="sdpa"
        )
        return model.to(spec.device).eval()
    config = transformers.AutoConfig.from_pretrained(spec.model_path)
    torch.manual_seed(spec.seed)
    with torch.device(spec.device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


# ---- continuous batching -------------------------------------------------------------------
def _run_continuous_batching(model: Any, workload: Workload, *, progress: bool) -> RunResult:
    from transformers import GenerationConfig

    gen_config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max(r.output_len for r in workload.requests),
        eos_token_id=None,  # transformers disables EOS for continuous batching when it is None
        pad_token_id=_PAD_ID,
    )
    # No inference_mode here: transformers' generation thread updates tensors made in this one.
    with _cb_manager(model, gen_config, workload) as manager:
        attention = model.config._attn_implementation  # what transformers switched to, if anything
        _synchronize()
        start = time.perf_counter()
        ids = [
            manager.add_request(r.prompt_token_ids, request_id=f"req-{i}", max_new_tokens=r.output_len)
            for i, r in enumerate(workload.requests)
        ]
        outputs = _collect_results(manager, ids, progress)
        _synchronize()
        elapsed = time.perf_counter() - start
    produced = [len(outputs[i].generated_tokens) for i in ids]
    errors = sorted({o.error for o in outputs.values() if getattr(o, "error", None)})
    return RunResult.measured(CB, workload, produced, elapsed, error="; ".join(errors) or None,
                              notes=[f"attention: {attention}"])


def _cb_manager(model: Any, gen_config: Any, workload: Workload) -> Any:
    """transformers' context manager (warm-up, start, stop), with the kwargs this version has."""
    params = inspect.signature(model.continuous_batching_context_manager).parameters
    kwargs: dict[str, Any] = {"generation_config": gen_config}
    if "block" in params:
        kwargs["block"] = True  # stop() waits for the generation thread
    if "workload_hints" in params:
        from transformers.generation.continuous_batching.utils import WorkloadHints

        kwargs["workload_hints"] = WorkloadHints(
            max_prompt_length=max(r.prompt_len for r in workload.requests),
            max_generated_length=max(r.output_len for r in workload.requests),
            num_requests=workload.num_requests,
        )
    return model.continuous_batching_context_manager(**kwargs)


def _collect_results(manager: Any, ids: list[str], progress: bool) -> dict[str, Any]:
    wanted, outputs = set(ids), {}
    with tqdm(total=len(ids), desc=CB, disable=not progress, dynamic_ncols=True) as bar:
        last_progress = time.monotonic()
        while len(outputs) < len(wanted):
            result = manager.get_result(timeout=1)
            if result is not None and result.request_id in wanted and result.is_finished():
                outputs[result.request_id] = result
                last_progress = time.monotonic()
                bar.update(1)
            elif not manager.is_running():
                raise RuntimeError(f"the generation thread stopped with {len(wanted) - len(outputs)} requests left")
            elif time.monotonic() - last_progress > _RESULT_TIMEOUT_S:
                raise RuntimeError(f"no request finished in {_RESULT_TIMEOUT_S:.0f} s")
    return outputs


# ---- static generate -----------------------------------------------------------------------
def _run_generate(model: Any, workload: Workload, *, batch_size: int, progress: bool) -> RunResult:
    import torch

    batches = [workload.requests[i : i + batch_size] for i in range(0, workload.num_requests, batch_size)]
    tensors = [_left_padded(batch, model.device) for batch in batches]  # built before the clock
    produced: list[int] = []
    with torch.inference_mode():
        _generate(model, tensors[0][0][:1], tensors[0][1][:1], 2)  # warm-up, untimed
    _synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        for batch, (input_ids, mask) in zip(tqdm(batches, desc=GENERATE, disable=not progress), tensors):
            longest = max(r.output_len for r in batch)
            out = _generate(model, input_ids, mask, longest)
            new_tokens = out.shape[1] - input_ids.shape[1]
            produced += [min(r.output_len, new_tokens) for r in batch]
    _synchronize()
    elapsed = time.perf_counter() - start
    return RunResult.measured(GENERATE, workload, produced, elapsed,
                              notes=[f"static batches of {batch_size}, each run to its longest request"])


def _generate(model: Any, input_ids: Any, mask: Any, num_tokens: int) -> Any:
    """Greedy, exactly num_tokens new tokens for every row (EOS cannot end a row early)."""
    return model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=num_tokens,
        min_new_tokens=num_tokens,
        eos_token_id=None,
        pad_token_id=_PAD_ID,
    )


def _left_padded(batch: list[Any], device: Any) -> tuple[Any, Any]:
    import torch

    width = max(r.prompt_len for r in batch)
    ids = torch.full((len(batch), width), _PAD_ID, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(batch), width), dtype=torch.long)  # [batch, width]
    for row, r in enumerate(batch):
        ids[row, width - r.prompt_len :] = torch.tensor(r.prompt_token_ids)
        mask[row, width - r.prompt_len :] = 1
    return ids.to(device), mask.to(device)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
