"""EngineArgs: every user-facing engine option in one flat place, turned into EngineConfig.

The same fields back `LLM(...)` keyword arguments and `folio serve` / `folio generate` flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from folio.config import (
    CacheConfig,
    DeviceConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    resolve_device,
)
from folio.logger import init_logger
from folio.transformers_utils.model_path import resolve_model_path

logger = init_logger(__name__)

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


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
    # vLLM's speculative_config: a dict, a JSON string (--speculative-config) or None.
    speculative_config: dict[str, Any] | str | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineArgs:
        unknown = sorted(set(kwargs) - cls.field_names())
        if unknown:
            raise TypeError(
                f"Unknown engine argument(s): {', '.join(unknown)}. "
                f"Known: {', '.join(sorted(cls.field_names()))}."
            )
        return cls(**kwargs)

    def create_engine_config(self) -> EngineConfig:
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
        )
        cache = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            cpu_kv_cache_space_gib=self.cpu_kv_cache_space,
            swap_space_gib=self.swap_space,
            enable_prefix_caching=self.enable_prefix_caching,
        )
        scheduler = SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self._max_num_batched_tokens(model.max_model_len),
            max_model_len=model.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            preemption_mode=self.preemption_mode,
            async_scheduling=self.async_scheduling,
        )
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be non-negative, got {self.max_logprobs}.")
        speculative = SpeculativeConfig.from_user(self.speculative_config)
        draft = self._draft_model_config(speculative, model, device)
        return EngineConfig(
            model, cache, scheduler, DeviceConfig(device), ParallelConfig(), speculative=speculative, draft_model=draft
        )

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

    def _max_num_batched_tokens(self, max_model_len: int) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if not self.enable_chunked_prefill:
            return max(DEFAULT_MAX_NUM_BATCHED_TOKENS, max_model_len)
        return max(DEFAULT_MAX_NUM_BATCHED_TOKENS, self.max_num_seqs)

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
            "--speculative-config",
            default=None,
            help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
            'or \'{"model": "path/to/draft", "num_speculative_tokens": 4}\'',
        )
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{name: getattr(args, name) for name in cls.field_names() if hasattr(args, name)})
