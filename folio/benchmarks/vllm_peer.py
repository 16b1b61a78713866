"""vLLM as a peer: the same timed generate calls as folio's, run by vLLM in a child process.

The child (`python -m folio.benchmarks.vllm_peer JOB.json RESULT.json`) imports vLLM alone, with
no folio module beyond this file, so vLLM gets its own CUDA context; the benchmarks run it before
folio builds its engine, and its exit frees the whole device for folio. vLLM runs at its defaults except what a token-id benchmark needs:
`skip_tokenizer_init=True` (no tokenizer in a config-only folder), `load_format="dummy"` when
folio used random weights, prompts as `{"prompt_token_ids": ...}`, `detokenize=False`, EOS ignored,
and the engine arguments the user set that vLLM names alike (SHARED_ENGINE_ARGS); any other
argument set is folio's alone, and the benchmark says so rather than drop it silently.

A job is a list of timed calls (`TimedCall`): each is one `LLM.generate` of its prompts, repeated
`repeat` times after one untimed warm-up call of the same shape; the result gives each
repetition's wall time and every request's output length, so the caller checks exact lengths as
it does for folio. Where vLLM lives: FOLIO_VLLM_SITE (default /tmp/vsite, where
/work/shared/tools/vllm-peer/install.sh unpacks it) goes first on the child's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

DEFAULT_SITE = "/tmp/vsite"
# FlashInfer is not in the bundle (vLLM then samples with PyTorch); no usage reports.
_VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}
_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class TimedCall:
    name: str
    prompts: list[list[int]]  # token ids
    max_tokens: list[int]  # per prompt; exactly this many are generated (EOS ignored)
    temperature: float = 0.0
    repeat: int = 1
    warmup: bool = True  # one untimed call of the same shape first (compilation, graph capture)
    # Give every call (warm-up included) its own first token, so no call finds an earlier one's
    # prompt in the prefix cache (both engines cache prefixes by default): ids stay below this.
    unique_prefix_below: int | None = None
    salt: int = 0  # distinct per call of a job (calls may share prompts): see prompts_for

    def prompts_for(self, rep: int) -> list[dict[str, list[int]]]:
        """The prompts of repetition rep (0 = the warm-up), as token-id prompts."""
        if self.unique_prefix_below is None:
            return [{"prompt_token_ids": p} for p in self.prompts]
        # 7919 is prime to any bound without factor 7919: distinct salts give distinct tokens.
        shift = 7919 * (self.salt * (self.repeat + 1) + rep + 1)
        return [{"prompt_token_ids": [(p[0] + shift) % self.unique_prefix_below, *p[1:]]} for p in self.prompts]


@dataclass
class CallResult:
    name: str
    elapsed_s: list[float] = field(default_factory=list)  # one per repetition
    produced: list[int] = field(default_factory=list)  # output lengths of the last repetition


@dataclass(frozen=True)
class VllmJob:
    model: str  # the checkpoint folder
    dtype: str
    dummy_weights: bool
    max_model_len: int | None
    seed: int
    calls: list[TimedCall]
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # set by the user, same name in vLLM


# folio engine arguments vLLM's LLM takes under the same name and meaning: passed on when the
# user set them. model, dtype, seed, max_model_len and load_format travel as VllmJob's fields.
SHARED_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "enforce_eager",
                      "enable_prefix_caching", "enable_chunked_prefill", "block_size", "quantization",
                      "num_gpu_blocks_override", "max_logprobs", "scheduling_policy")
JOB_ENGINE_ARGS = ("model", "tokenizer", "served_model_name", "dtype", "seed", "max_model_len", "device",
                   "load_format")


def split_engine_args(engine_args: Any) -> tuple[dict[str, Any], list[str]]:
    """(what the peer gets, what it cannot get) of the engine arguments that differ from the
    defaults: the shared ones pass on, the others are folio's only and named to the user."""
    defaults = type(engine_args)()
    changed = [f.name for f in fields(engine_args)
               if f.name not in JOB_ENGINE_ARGS and getattr(engine_args, f.name) != getattr(defaults, f.name)]
    passed = {name: getattr(engine_args, name) for name in changed if name in SHARED_ENGINE_ARGS}
    return passed, [name for name in changed if name not in SHARED_ENGINE_ARGS]


def vllm_site() -> str:
    return os.environ.get("FOLIO_VLLM_SITE", DEFAULT_SITE)


def child_env() -> dict[str, str]:
    """The environment the vLLM child runs in: vLLM's site first, then this repository."""
    env = dict(os.environ, **_VLLM_ENV)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [vllm_site(), here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def vllm_version() -> str | None:
    """vLLM's version when it imports in the child's environment, else None."""
    probe = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"],
                           env=child_env(), capture_output=True, text=True, timeout=300)
    return probe.stdout.strip().splitlines()[-1] if probe.returncode == 0 and probe.stdout.strip() else None


def run_vllm(job: VllmJob) -> list[CallResult]:
    """Run the job in a vLLM child process; raises RuntimeError with the child's output tail."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, result_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        with open(job_path, "w", encoding="utf-8") as f:
            json.dump(asdict(job), f)
        proc = subprocess.run([sys.executable, "-m", "folio.benchmarks.vllm_peer", job_path, result_path],
                              env=child_env(), capture_output=True, text=True, timeout=_TIMEOUT_S)
        if proc.returncode != 0 or not os.path.exists(result_path):
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise RuntimeError(f"vLLM child exited with {proc.returncode}: {tail}")
        with open(result_path, encoding="utf-8") as f:
            return [CallResult(**r) for r in json.load(f)]


# ---- the child -----------------------------------------------------------------------------
def _child_main(job_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams

    with open(job_path, encoding="utf-8") as f:
        raw = json.load(f)
    calls = [TimedCall(**c) for c in raw.pop("calls")]
    job = VllmJob(calls=[], **raw)
    kwargs: dict[str, Any] = {"model": job.model, "dtype": job.dtype, "skip_tokenizer_init": True, "seed": job.seed,
                              **job.engine_kwargs}
    if job.dummy_weights:
        kwargs["load_format"] = "dummy"
    if job.max_model_len:
        kwargs["max_model_len"] = job.max_model_len
    start = time.perf_counter()
    llm = LLM(**kwargs)
    print(f"vLLM engine ready in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    results = [asdict(r) for r in time_calls(llm, calls, SamplingParams)]
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


def time_calls(llm: Any, calls: list[TimedCall], sampling_params: Any) -> list[CallResult]:
    """Each call through `llm.generate` (folio's LLM or vLLM's: the same names), its warm-up
    untimed, the device synchronised around each timed repeat. `sampling_params`: the engine's
    SamplingParams class."""
    results = []
    for call in calls:
        params = [sampling_params(temperature=call.temperature, max_tokens=m, ignore_eos=True, detokenize=False)
                  for m in call.max_tokens]
        if call.warmup:
            llm.generate(call.prompts_for(0), params, use_tqdm=False)
        result = CallResult(call.name)
        for i in range(call.repeat):
            prompts = call.prompts_for(i + 1)
            _synchronize()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            _synchronize()
            result.elapsed_s.append(time.perf_counter() - start)
            result.produced = [len(o.outputs[0].token_ids) for o in outputs]
        results.append(result)
    return results


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
