"""VLLM_ARGS: how folio treats each of vLLM 0.22's `LLM(...)` / `EngineArgs` arguments, in one table.

Every row is one vLLM argument with a status:
- honoured: an EngineArgs field; folio does what vLLM does with it.
- no-op: accepted because the value changes nothing in folio (tensor_parallel_size=1, ...);
  values that would change something are an error.
- pending: folio will honour it (the `owner` column names the work that adds it); until then
  vLLM's default is accepted and any other value raises "not supported yet". A pending row flips
  to honoured by itself once EngineArgs has a field of that name.
- error: folio cannot honour a non-default value; the default is accepted.

`split_vllm_kwargs` checks the non-field arguments of a call against the table and returns what
EngineArgs takes; docs/vllm-compat.md is generated from the table (scripts/vllm_compat_doc.py).
"""

from __future__ import annotations

import difflib
import enum
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from folio.logger import init_logger


logger = init_logger(__name__)

class Status(enum.Enum):
    HONOURED = "honoured"
    NOOP = "no-op"
    PENDING = "not supported yet"
    ERROR = "error"


class _Any:
    """Marker for rows whose every value is accepted."""

    def __repr__(self) -> str:
        return "any"


ANY = _Any()
NO_BAD_VALUE = object()  # a row with no value that errors (every value is fine)


@dataclass(frozen=True)
class VllmArg:
    name: str
    status: Status
    group: str  # vLLM's config class, for --help and the docs
    note: str
    accepted: tuple[Any, ...] | _Any = ANY  # values taken without error (non-honoured rows)
    bad: Any = NO_BAD_VALUE  # one value that must raise (for the docs and the table test)
    owner: str = ""  # pending rows: the piece of work that will honour it
    # CLI: the flag's argparse keywords (type/action/default); None: no flag for it.
    cli: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    # Extra check needing the whole call (e.g. revision with a local folder); returns an error.
    check: Callable[[Any, Mapping[str, Any]], str | None] | None = field(default=None, hash=False, compare=False)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def accepts(self, value: Any) -> bool:
        if isinstance(self.accepted, _Any):
            return True
        return any(_same(value, ok) for ok in self.accepted)


def _same(value: Any, ok: Any) -> bool:
    """Equal and of the same type: True is not 1, 1.0 is not 1 (vLLM's types are exact)."""
    if isinstance(ok, bool) or isinstance(value, bool) or ok is None or value is None:
        return value is ok
    return type(value) is type(ok) and value == ok


def _json_arg(text: str) -> Any:
    """A JSON value on the command line (vLLM's dict flags): '{"a": 1}'."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {text!r} ({e})") from None


_json_arg.__name__ = "JSON"  # argparse names the type in its error message


def _local_model_only(value: Any, call: Mapping[str, Any]) -> str | None:
    """revision / download_dir mean nothing for a local folder; for a hub id folio fetches the
    default branch into the hub cache, so another value would be silently wrong."""
    if value is None:
        return None
    model = call.get("model")
    if model is not None and os.path.isdir(os.path.expanduser(str(model))):
        return None
    return "it is only accepted with a local checkpoint folder as model (folio fetches hub ids' default revision, with the environment's HF_TOKEN)"


def _honoured(name: str, group: str, note: str = "", cli: dict[str, Any] | None = None) -> VllmArg:
    return VllmArg(name, Status.HONOURED, group, note, cli=cli)


def _noop(name: str, group: str, note: str, accepted: tuple[Any, ...] | _Any = ANY, bad: Any = NO_BAD_VALUE,
          cli: dict[str, Any] | None = None, check=None) -> VllmArg:
    return VllmArg(name, Status.NOOP, group, note, accepted, bad, cli=cli, check=check)


def _pending(name: str, group: str, owner: str, accepted: tuple[Any, ...], bad: Any, note: str = "",
             cli: dict[str, Any] | None = None) -> VllmArg:
    return VllmArg(name, Status.PENDING, group, note, accepted, bad, owner, cli=cli)


def _error(name: str, group: str, accepted: tuple[Any, ...], bad: Any, note: str,
           cli: dict[str, Any] | None = None) -> VllmArg:
    return VllmArg(name, Status.ERROR, group, note, accepted, bad, cli=cli)


_BOOL = {"action": "store_true", "default": False}
_INT1 = {"type": int, "default": 1}
_JSON = {"type": _json_arg, "default": None}
_STR = {"type": str, "default": None}

# fmt: off
VLLM_ARGS: tuple[VllmArg, ...] = (
    # ---- ModelConfig
    _honoured("model", "ModelConfig", "checkpoint folder or hub id; none: the built-in demo model"),
    _honoured("tokenizer", "ModelConfig"),
    _honoured("served_model_name", "ModelConfig", "one name (a list of one is taken)"),
    _honoured("dtype", "ModelConfig"),
    _honoured("seed", "ModelConfig", "None means 0"),
    _honoured("max_model_len", "ModelConfig"),
    _honoured("max_logprobs", "ModelConfig"),
    _honoured("enforce_eager", "ModelConfig"),
    _honoured("skip_tokenizer_init", "ModelConfig", "token ids in, token ids out (no text)", cli=_BOOL),
    _honoured("hf_overrides", "ModelConfig", "dict merged into config.json", cli=_JSON),
    _honoured("generation_config", "ModelConfig", "'auto' (the checkpoint's), 'vllm' (none) or a folder",
              cli={"type": str, "default": "auto"}),
    _honoured("override_generation_config", "ModelConfig", "dict merged over the generation config", cli=_JSON),
    _noop("trust_remote_code", "ModelConfig",
          "folio runs its own implementation of each supported architecture; no remote code is ever run",
          cli=_BOOL),
    _noop("tokenizer_mode", "ModelConfig", "folio loads the Hugging Face (fast) tokenizer",
          accepted=("auto", "hf"), bad="mistral", cli={"type": str, "default": "auto"}),
    _noop("revision", "ModelConfig", "accepted with a local checkpoint folder", bad="main",
          cli=_STR, check=_local_model_only),
    _noop("tokenizer_revision", "ModelConfig", "accepted with a local checkpoint folder", bad="main",
          cli=_STR, check=_local_model_only),
    _noop("code_revision", "ModelConfig", "no remote code is run", cli=_STR),
    _noop("model_impl", "ModelConfig", "folio's own implementation", accepted=("auto", "vllm"),
          bad="transformers", cli={"type": str, "default": "auto"}),
    _noop("max_seq_len_to_capture", "ModelConfig", "CUDA graphs cover decode batches", cli={"type": int, "default": None}),
    _noop("disable_sliding_window", "ModelConfig", "sliding windows are always applied", accepted=(False,),
          bad=True, cli=_BOOL),
    _noop("disable_cascade_attn", "ModelConfig", "folio has no cascade attention", cli=_BOOL),
    _error("logprobs_mode", "ModelConfig", ("raw_logprobs",), "processed_logprobs",
           "folio's logprobs are of the raw logits", cli={"type": str, "default": "raw_logprobs"}),
    _noop("runner", "ModelConfig", "one model serves generation and embeddings (LLM.embed, /v1/embeddings)",
          accepted=("auto", "generate", "pooling"), bad="draft", cli={"type": str, "default": "auto"}),
    _noop("convert", "ModelConfig", "a decoder model embeds by pooling its last hidden states",
          accepted=("auto", "none", "embed"), bad="classify", cli={"type": str, "default": "auto"}),
    _honoured("pooler_config", "ModelConfig", "pooling_type LAST (default) or MEAN, normalize", cli=_JSON),
    _noop("hf_token", "ModelConfig", "accepted with a local checkpoint folder", bad="hf_xxx", cli=None,
          check=_local_model_only),
    _noop("config_format", "ModelConfig", "config.json is read as Hugging Face writes it", accepted=("auto", "hf"),
          bad="mistral", cli={"type": str, "default": "auto"}),
    _noop("task", "ModelConfig", "vLLM's older name for runner", accepted=("auto", "generate", "embed"),
          bad="classify", cli=None),
    _error("logits_processors", "ModelConfig", (None, []), ["my.Processor"],
           "engine-wide processor classes; per-request callables go in SamplingParams.logits_processors", cli=None),
    _error("enable_prompt_embeds", "ModelConfig", (False,), True, "prompts are token ids", cli=_BOOL),
    _noop("allowed_local_media_path", "ModelConfig", "text only: no media is read", accepted=("", None),
          bad="/tmp", cli={"type": str, "default": ""}),
    _pending("quantization", "ModelConfig", "quant", (None,), "fp8", cli={"type": str, "default": None, "aliases": ["-q"]}),
    # ---- LoadConfig
    _honoured("load_format", "LoadConfig"),
    _noop("download_dir", "LoadConfig", "accepted with a local checkpoint folder", bad="/tmp/hub",
          cli=_STR, check=_local_model_only),
    _noop("use_tqdm_on_load", "LoadConfig", "no load progress bar", cli=None),
    _noop("max_parallel_loading_workers", "LoadConfig", "weights load in one thread", cli={"type": int, "default": None}),
    # ---- CacheConfig
    _honoured("block_size", "CacheConfig", "None means 16"),
    _honoured("gpu_memory_utilization", "CacheConfig"),
    _honoured("num_gpu_blocks_override", "CacheConfig"),
    _honoured("swap_space", "CacheConfig"),
    _honoured("enable_prefix_caching", "CacheConfig", "None means on"),
    _pending("kv_cache_dtype", "CacheConfig", "quant", ("auto",), "fp8", cli={"type": str, "default": "auto"}),
    _error("cpu_offload_gb", "CacheConfig", (0, 0.0), 4, "weights stay on the device",
           cli={"type": float, "default": 0}),
    _noop("calculate_kv_scales", "CacheConfig", "FP8 KV scales come from the checkpoint (1.0 without one); folio does not calculate them", accepted=(False,), bad=True, cli=_BOOL),
    _error("kv_cache_memory_bytes", "CacheConfig", (None,), 2**30,
           "size the KV cache with gpu_memory_utilization or num_gpu_blocks_override", cli={"type": int, "default": None}),
    _noop("mm_processor_cache_gb", "CacheConfig", "text only: nothing to cache", cli={"type": float, "default": 4}),
    _noop("prefix_caching_hash_algo", "CacheConfig", "folio's block hash is SHA-256 based",
          accepted=("sha256", "sha256_cbor", "builtin"), bad="md5", cli={"type": str, "default": "sha256"}),
    # ---- ParallelConfig
    _pending("tensor_parallel_size", "ParallelConfig", "tp", (1,), 2, cli={**_INT1, "aliases": ["-tp"]}),
    _pending("nnodes", "ParallelConfig", "tp", (1,), 2, "machines the ranks span (torchrun's NNODES)"),
    _pending("node_rank", "ParallelConfig", "tp", (0,), 1, "this machine's index (torchrun's NODE_RANK)"),
    _pending("master_addr", "ParallelConfig", "tp", (None,), "10.0.0.1", "rank 0's address"),
    _pending("master_port", "ParallelConfig", "tp", (None,), 29501, "rank 0's rendezvous port"),
    _error("pipeline_parallel_size", "ParallelConfig", (1,), 2, "no pipeline parallelism", cli=_INT1),
    _error("data_parallel_size", "ParallelConfig", (1,), 2, "run one server per GPU instead", cli=_INT1),
    _error("enable_expert_parallel", "ParallelConfig", (False,), True, "no MoE models", cli=_BOOL),
    _pending("distributed_executor_backend", "ParallelConfig", "tp", (None, "mp"), "ray",
             "one process per rank, started by the engine", cli=_STR),
    _noop("disable_custom_all_reduce", "ParallelConfig", "torch.distributed's all-reduce", cli=_BOOL),
    _noop("worker_cls", "ParallelConfig", "folio's worker", accepted=("auto",), bad="my.Worker",
          cli={"type": str, "default": "auto"}),
    # ---- SchedulerConfig
    _honoured("max_num_seqs", "SchedulerConfig", "None means 256"),
    _honoured("max_num_batched_tokens", "SchedulerConfig"),
    _honoured("enable_chunked_prefill", "SchedulerConfig", "None means on"),
    _honoured("scheduling_policy", "SchedulerConfig"),
    _honoured("async_scheduling", "SchedulerConfig", "None means on"),
    _honoured("preemption_mode", "SchedulerConfig", "folio extra: recompute or swap"),
    _noop("cuda_graph_sizes", "SchedulerConfig", "folio captures its own decode batch sizes (enforce_eager: none)",
          cli=None),
    _noop("disable_hybrid_kv_cache_manager", "SchedulerConfig", "one KV cache manager for every supported model",
          cli=_BOOL),
    _noop("disable_chunked_mm_input", "SchedulerConfig", "text only", cli=_BOOL),
    _noop("disable_async_output_proc", "SchedulerConfig", "outputs are processed while the next step runs",
          cli=_BOOL),
    # ---- LoRAConfig
    _pending("enable_lora", "LoRAConfig", "lora", (False,), True, cli=_BOOL),
    _pending("max_loras", "LoRAConfig", "lora", (1,), 4, cli=_INT1),
    _pending("max_lora_rank", "LoRAConfig", "lora", (16,), 64, cli={"type": int, "default": 16}),
    _pending("max_cpu_loras", "LoRAConfig", "lora", (None,), 8, cli={"type": int, "default": None}),
    # ---- SpeculativeConfig / StructuredOutputsConfig
    _pending("speculative_config", "SpeculativeConfig", "spec", (None,), {"method": "ngram"}, cli=_JSON),
    _pending("structured_outputs_config", "StructuredOutputsConfig", "so", (None,), {"backend": "xgrammar"},
             cli=_JSON),
    # ---- MultiModalConfig
    _error("limit_mm_per_prompt", "MultiModalConfig", (None,), {"image": 1}, "text-only models", cli=_JSON),
    _error("mm_processor_kwargs", "MultiModalConfig", (None,), {"num_crops": 4}, "text-only models", cli=_JSON),
    # ---- ObservabilityConfig
    _noop("disable_log_stats", "ObservabilityConfig", "folio logs no periodic stats; /metrics is always on",
          cli=_BOOL),
    _noop("show_hidden_metrics_for_version", "ObservabilityConfig", "no hidden metrics", cli=_STR),
    _error("collect_detailed_traces", "ObservabilityConfig", (None,), ["model"], "no tracing", cli=_JSON),
    _error("otlp_traces_endpoint", "ObservabilityConfig", (None,), "http://localhost:4317", "no tracing",
           cli=_STR),
    # ---- VllmConfig
    _noop("compilation_config", "VllmConfig",
          "folio compiles nothing; CUDA graphs follow enforce_eager", cli={**_JSON, "aliases": ["-O"]}),
    _error("kv_transfer_config", "VllmConfig", (None,), {"kv_connector": "x"}, "no disaggregated prefill", cli=_JSON),
    _error("enable_sleep_mode", "ModelConfig", (False,), True, "no sleep mode", cli=_BOOL),
)
# fmt: on

BY_NAME: dict[str, VllmArg] = {row.name: row for row in VLLM_ARGS}
# Honoured vLLM arguments whose None means folio's default (vLLM resolves None late).
NONE_MEANS_DEFAULT = frozenset({"seed", "block_size", "enable_prefix_caching", "max_num_seqs",
                                "enable_chunked_prefill", "async_scheduling"})


def effective_status(row: VllmArg, engine_fields: set[str]) -> Status:
    """A row whose argument EngineArgs now has is honoured, whatever the table still says."""
    return Status.HONOURED if row.name in engine_fields else row.status


def check_value(row: VllmArg, value: Any, call: Mapping[str, Any]) -> None:
    """Raise ValueError naming the argument and value unless folio can take `value` for it."""
    if not row.accepts(value):
        allowed = ", ".join(repr(v) for v in row.accepted)  # type: ignore[union-attr]
        if row.status is Status.PENDING:
            why = f"is not supported yet (it will come with folio's {row.owner} work); only {allowed} is accepted now"
        else:
            why = f"cannot be honoured by folio ({row.note}); accepted: {allowed}"
        raise ValueError(f"{row.name}={value!r} {why}.")
    if row.check is not None:
        problem = row.check(value, call)
        if problem:
            raise ValueError(f"{row.name}={value!r}: {problem}.")


class UnknownEngineArgumentError(TypeError, ValueError):
    """An engine argument neither folio nor vLLM has: a TypeError as in vLLM (an unknown keyword),
    and a ValueError like every other refused engine argument."""


def unknown_argument_error(unknown: list[str], engine_fields: set[str]) -> UnknownEngineArgumentError:
    known = sorted(engine_fields | set(BY_NAME))
    parts = []
    for name in unknown:
        near = difflib.get_close_matches(name, known, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return UnknownEngineArgumentError(
        f"Unknown engine argument(s): {', '.join(parts)}. "
        "docs/vllm-compat.md lists every vLLM argument folio knows."
    )


def split_vllm_kwargs(kwargs: Mapping[str, Any], engine_fields: set[str],
                      call: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """EngineArgs' own keyword arguments from a vLLM-style call.

    Table arguments that are not EngineArgs fields are checked and dropped (each is a no-op or
    raises ValueError); names in neither raise UnknownEngineArgumentError (a TypeError, as an
    unknown keyword is in vLLM, and a ValueError). `call`: the whole call, positional arguments
    included, for checks that look at other arguments (default: kwargs)."""
    unknown = sorted(k for k in kwargs if k not in engine_fields and k not in BY_NAME)
    if unknown:
        raise unknown_argument_error(unknown, engine_fields)
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        row = BY_NAME.get(name)
        if name in engine_fields:
            if value is None and name in NONE_MEANS_DEFAULT:
                continue
            if name == "served_model_name" and isinstance(value, (list, tuple)):
                if len(value) > 1:
                    raise ValueError(f"served_model_name={list(value)!r}: folio serves a model under one name.")
                value = value[0] if value else None
            out[name] = value
        elif row is not None:
            check_value(row, value, kwargs if call is None else call)
            if row.status is Status.NOOP and not _is_cli_default(row, value):
                # Accepted, but the user asked for something: say that nothing comes of it.
                logger.warning("vLLM argument %s=%r has no effect in folio: %s.", name, value, row.note)
    return out


def _is_cli_default(row: VllmArg, value: Any) -> bool:
    """Whether value is what the flag holds when it is not given (the CLI passes every flag)."""
    return value is None or (row.cli is not None and row.cli.get("default", object()) == value)
