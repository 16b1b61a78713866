"""EngineArgs: every user-facing engine option in one flat place, turned into EngineConfig.

The same fields back `LLM(...)` keyword arguments and `folio serve` / `folio generate` flags.
`EngineArgs(...)` takes vLLM's names too, as `LLM(...)` does: a vLLM argument that is not a field
is checked against folio/engine/vllm_args.py's table (a no-op, or a ValueError naming it) and not
stored; a name in neither is an UnknownEngineArgumentError (a TypeError and a ValueError).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any

from folio.config import (
    CacheConfig,
    DeviceConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    StructuredOutputsConfig,
    SpeculativeConfig,
    resolve_device,
)
from folio.engine.vllm_args import split_vllm_kwargs
from folio.logger import init_logger
from folio.param_checks import SamplingParamsError, check_bool, check_int, check_number
from folio.transformers_utils.model_path import resolve_model_path

logger = init_logger(__name__)

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# GPUs with this much memory (H100/H200 class) default to LARGE_GPU_MAX_NUM_BATCHED_TOKENS:
# measured on an H100 80GB (docs/perf-notes.md, "max_num_batched_tokens by device").
LARGE_GPU_MIN_MEMORY_GIB = 70
LARGE_GPU_MAX_NUM_BATCHED_TOKENS = 16384


def default_max_num_batched_tokens(device: str) -> int:
    """Tokens per step when the user sets none: more on large GPUs, where longer prefill chunks
    keep the matrix units busier at no cost to the decode rows sharing the step."""
    if device == "cuda":
        import torch

        memory_gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
        if memory_gib >= LARGE_GPU_MIN_MEMORY_GIB:
            return LARGE_GPU_MAX_NUM_BATCHED_TOKENS
    return DEFAULT_MAX_NUM_BATCHED_TOKENS


@dataclass
class EngineArgs:
    model: str | None = None  # None: the built-in demo model
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    device: str = "auto"
    load_format: str = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    swap_space: float = 4.0  # GiB of CPU memory for swapped-out KV blocks
    cpu_kv_cache_space: float = 4.0  # GiB of KV cache when running on the CPU
    scheduling_policy: str = "fcfs"
    preemption_mode: str | None = None
    attention_backend: str = "auto"
    max_logprobs: int = 20
    async_scheduling: bool = True
    # vLLM's names (folio/engine/vllm_args.py lists every vLLM argument and what folio does with it)
    skip_tokenizer_init: bool = False  # token ids in, token ids out
    hf_overrides: dict[str, Any] | None = None  # merged into config.json
    generation_config: str = "auto"  # "auto": the checkpoint's; "vllm": none; or a folder
    override_generation_config: dict[str, Any] | None = None
    pooler_config: dict[str, Any] | None = None  # embeddings: {"pooling_type": "LAST"|"MEAN", "normalize": bool}
    quantization: str | None = None  # None: the checkpoint's quantization_config, if any
    # Multi-LoRA (vLLM's names): adapters per step, their largest rank, adapters kept on the CPU.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    kv_cache_dtype: str = "auto"  # "fp8": e4m3 KV cache, half the bytes per token
    # vLLM's structured_outputs_config: a dict of StructuredOutputsConfig fields (or the object).
    structured_outputs_config: dict[str, Any] | StructuredOutputsConfig | None = None
    # Tensor parallelism (docs/tensor-parallel.md): ranks, and torchrun-style rendezvous.
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None or "mp"
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    # vLLM's speculative_config: a dict, a JSON string (--speculative-config) or None.
    speculative_config: dict[str, Any] | str | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineArgs:
        """EngineArgs from folio's or vLLM's keyword arguments (the same as `EngineArgs(**kwargs)`)."""
        return cls(**kwargs)

    def create_engine_config(self) -> EngineConfig:
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an int, got {type(self.seed).__name__} {self.seed!r}.")
        self._check_types()
        device = resolve_device(self.device)
        model_path = resolve_model_path(self.model)
        model = ModelConfig.create(
            model_path,
            tokenizer=resolve_model_path(self.tokenizer) if self.tokenizer else None,
            served_model_name=self.served_model_name or (self.model or "folio-demo"),
            dtype=self.dtype,
            device=device,
            max_model_len=self.max_model_len,
            seed=self.seed,
            load_format=self.load_format,
            enforce_eager=self.enforce_eager,
            attention_backend=self.attention_backend,
            skip_tokenizer_init=self.skip_tokenizer_init,
            hf_overrides=self.hf_overrides,
            generation_config_source=self.generation_config,
            override_generation_config=self.override_generation_config,
            pooler_config=self.pooler_config,
            quantization=self.quantization,
        )
        cache = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            cpu_kv_cache_space_gib=self.cpu_kv_cache_space,
            swap_space_gib=self.swap_space,
            enable_prefix_caching=self.enable_prefix_caching,
            cache_dtype=self.kv_cache_dtype,
        )
        scheduler = SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self._max_num_batched_tokens(model.max_model_len, device),
            max_model_len=model.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            preemption_mode=self.preemption_mode,
            async_scheduling=self.async_scheduling,
        )
        check_int("max_logprobs", self.max_logprobs, minimum=0, what="non-negative")
        lora = LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras) if self.enable_lora else None
        self._warn_unused_lora_args()
        structured = StructuredOutputsConfig.from_value(self.structured_outputs_config)
        parallel = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            nnodes=self.nnodes,
            node_rank=self.node_rank,
            master_addr=self.master_addr,
            master_port=self.master_port,
            distributed_executor_backend=self.distributed_executor_backend,
        )
        _check_heads_divide(model, parallel.tensor_parallel_size)
        speculative = SpeculativeConfig.from_user(self.speculative_config)
        if speculative is not None and parallel.tensor_parallel_size > 1:
            # Drafts and verification run on rank 0's runner only so far (docs/spec_decode.md).
            raise ValueError("speculative_config with tensor_parallel_size > 1 is not supported yet.")
        draft = self._draft_model_config(speculative, model, device)
        if lora is not None and parallel.tensor_parallel_size > 1:
            # The step plan sent to the workers does not carry adapter slots yet (docs/lora.md).
            raise ValueError("enable_lora with tensor_parallel_size > 1 is not supported yet.")
        return EngineConfig(model, cache, scheduler, DeviceConfig(device), parallel, lora=lora,
                            structured_outputs=structured, speculative=speculative, draft_model=draft)

    def _check_types(self) -> None:
        """The types the config classes do not check themselves: Python callers (LLM(...)) pass
        anything, and "no" would turn a flag on, "0.5" fail a comparison with a TypeError. The
        CLI gives real bools and numbers (argparse's types), so it always passes."""
        for name in _BOOL_ARGS:
            check_bool(name, getattr(self, name))
        for name in _NUMBER_ARGS:
            check_number(name, getattr(self, name))
        for name in _OPTIONAL_INT_ARGS:
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=1, what="a positive integer")
        for name in ("model", "tokenizer"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise SamplingParamsError(name, f"{name} must be a checkpoint folder or hub id (a str), got {value!r}.")
        if self.served_model_name is not None and not isinstance(self.served_model_name, str):
            raise SamplingParamsError("served_model_name", f"served_model_name must be a str, got {self.served_model_name!r}.")

    def _draft_model_config(
        self, speculative: SpeculativeConfig | None, target: ModelConfig, device: str
    ) -> ModelConfig | None:
        """The draft checkpoint, in the target's dtype and context length."""
        if speculative is None or speculative.model is None:
            return None
        try:
            return ModelConfig.create(
                resolve_model_path(speculative.model),
                dtype=target.dtype,
                device=device,
                max_model_len=target.max_model_len,
                seed=self.seed,
                load_format=self.load_format,
                enforce_eager=self.enforce_eager,
                attention_backend=self.attention_backend,
            )
        except ValueError as e:
            raise ValueError(f"speculative_config model {speculative.model!r}: {e}") from None

    def _warn_unused_lora_args(self) -> None:
        if self.enable_lora:
            return
        unused = [name for name in ("max_loras", "max_lora_rank", "max_cpu_loras")
                  if getattr(self, name) != getattr(EngineArgs, name)]
        if unused:
            logger.warning("%s apply only with enable_lora=True (--enable-lora): ignored.", ", ".join(unused))

    def _max_num_batched_tokens(self, max_model_len: int, device: str) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        default = default_max_num_batched_tokens(device)
        if not self.enable_chunked_prefill:
            return max(default, max_model_len)
        return max(default, self.max_num_seqs)

    # ---- command line -----------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        d = EngineArgs()
        g = parser.add_argument_group("engine")
        g.add_argument("--model", default=None, help="checkpoint folder or hub id (default: the built-in demo model)")
        g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
        g.add_argument("--served-model-name", default=None, help="model name in the API (default: --model)")
        g.add_argument("--dtype", default=d.dtype, help="auto, float32, bfloat16 or float16")
        g.add_argument("--seed", type=int, default=d.seed)
        g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
        g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
        g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
        g.add_argument("--num-gpu-blocks-override", type=int, default=None)
        g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
        g.add_argument("--max-num-batched-tokens", type=int, default=None)
        g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
        g.add_argument("--device", default=d.device, choices=["auto", "cuda", "cpu"])
        g.add_argument("--load-format", default=d.load_format, choices=["auto", "safetensors", "pt", "dummy"])
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching)
        g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=d.enable_chunked_prefill)
        g.add_argument("--swap-space", type=float, default=d.swap_space, help="GiB of CPU swap for KV blocks")
        g.add_argument("--cpu-kv-cache-space", type=float, default=d.cpu_kv_cache_space, help="GiB of KV cache on the CPU")
        g.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=["fcfs", "priority"])
        g.add_argument("--preemption-mode", default=None, choices=["recompute", "swap"])
        g.add_argument("--attention-backend", default=d.attention_backend, choices=["auto", "torch", "triton"])
        g.add_argument("--max-logprobs", type=int, default=d.max_logprobs)
        g.add_argument(
            "--async-scheduling",
            action=argparse.BooleanOptionalAction,
            default=d.async_scheduling,
            help="plan and launch each step while the previous one runs on the device",
        )
        g.add_argument(
            "--quantization",
            "-q",
            default=None,
            help="compressed-tensors, gptq, awq (read from the checkpoint; default: its "
            "quantization_config), or fp8 / int4-rtn to quantize an unquantized checkpoint on load",
        )
        g.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters on top of the model")
        g.add_argument("--max-loras", type=int, default=d.max_loras, help="distinct adapters in one step (GPU slots)")
        g.add_argument("--max-lora-rank", type=int, default=d.max_lora_rank, help="largest adapter rank")
        g.add_argument("--max-cpu-loras", type=int, default=None, help="adapters kept on the CPU (default: --max-loras)")
        g.add_argument(
            "--kv-cache-dtype",
            default=d.kv_cache_dtype,
            choices=["auto", "fp8", "fp8_e4m3"],
            help="fp8: store K/V as e4m3 with per-tensor scales (the checkpoint's, else 1.0)",
        )
        g.add_argument(
            "--structured-outputs-config",
            type=_json_object,
            default=None,
            help='grammar backend options as JSON, e.g. \'{"backend": "xgrammar"}\' (auto, xgrammar, guidance)',
        )
        g.add_argument(
            "--speculative-config",
            default=None,
            help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
            'or \'{"model": "path/to/draft", "num_speculative_tokens": 4}\'',
        )
        EngineArgs._add_parallel_cli_args(parser)
        from folio.engine.vllm_cli import add_vllm_flags

        add_vllm_flags(parser)  # vLLM's flag names, after folio's own (which take precedence)
        return parser

    @staticmethod
    def _add_parallel_cli_args(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("tensor parallelism (docs/tensor-parallel.md)")
        g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="GPUs (ranks) sharing the model")
        g.add_argument("--distributed-executor-backend", default=None, choices=["mp"],
                       help="one process per rank, started by the engine (the only backend)")
        g.add_argument("--nnodes", type=int, default=1, help="machines the ranks span (torchrun's NNODES)")
        g.add_argument("--node-rank", type=int, default=0, help="this machine's index (torchrun's NODE_RANK)")
        g.add_argument("--master-addr", default=None, help="rank 0's address (default: $MASTER_ADDR, or 127.0.0.1)")
        g.add_argument("--master-port", type=int, default=None,
                       help="rank 0's rendezvous port (default: $MASTER_PORT, or a free port on one node)")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        from folio.engine.vllm_args import BY_NAME

        names = cls.field_names() | set(BY_NAME)
        kwargs = {name: getattr(args, name) for name in names if hasattr(args, name)}
        return cls.from_kwargs(**_with_reasoning_parser(kwargs, getattr(args, "reasoning_parser", None)))


def _with_reasoning_parser(kwargs: dict[str, Any], parser: str | None) -> dict[str, Any]:
    """The server's --reasoning-parser also tells the grammars where reasoning ends, as vLLM's
    fills structured_outputs_config.reasoning_parser (a config that names its own wins)."""
    config = kwargs.get("structured_outputs_config")
    if parser is None or not isinstance(config, (dict, type(None))):
        return kwargs
    return {**kwargs, "structured_outputs_config": {"reasoning_parser": parser, **(config or {})}}


# Arguments typed here (EngineArgs._check_types); the rest are checked by their config classes.
_BOOL_ARGS = ("enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling",
              "skip_tokenizer_init", "enable_lora")
_NUMBER_ARGS = ("gpu_memory_utilization", "swap_space", "cpu_kv_cache_space")
_OPTIONAL_INT_ARGS = ("max_num_seqs", "max_num_batched_tokens")


def _vllm_aware_init(dataclass_init):
    """EngineArgs.__init__: the dataclass's own, after vLLM's names are checked and dropped and
    vLLM's None defaults resolved (vllm_args.split_vllm_kwargs), so that `EngineArgs(...)`,
    `LLM(...)` and `dataclasses.replace` treat every argument alike. Positional arguments go to
    the dataclass as they are; checks that need the whole call (revision with a local model) see
    them too."""
    init_names = [f.name for f in dataclasses.fields(EngineArgs) if f.init]
    field_names = set(init_names)

    @functools.wraps(dataclass_init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        call = {**dict(zip(init_names, args)), **kwargs}
        dataclass_init(self, *args, **split_vllm_kwargs(kwargs, field_names, call))

    return __init__


EngineArgs.__init__ = _vllm_aware_init(EngineArgs.__init__)  # type: ignore[method-assign]


def _json_object(text: str) -> dict[str, Any]:
    """argparse type of a flag whose value is a JSON object."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _check_heads_divide(model: ModelConfig, tp: int) -> None:
    """The attention heads' split over the ranks (layers/linear.py's rule), checked before any
    worker process starts rather than in each of them after they have."""
    if tp == 1 or not model.hf_config.get("num_attention_heads"):
        return
    heads, kv_heads = model.num_attention_heads, model.num_kv_heads
    if heads % tp:
        raise ValueError(f"{heads} attention heads do not divide over {tp} tensor-parallel ranks "
                         f"(tensor_parallel_size must divide {heads}).")
    if (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
        raise ValueError(f"{kv_heads} KV heads cannot be split or replicated evenly over {tp} tensor-parallel ranks.")
