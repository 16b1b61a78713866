"""KV cache sizing and allocation: how many blocks fit, and one tensor holding them all."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from folio.config import EngineConfig
from folio.logger import init_logger

logger = init_logger(__name__)

_GIB = 1 << 30


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    # Bytes per block held elsewhere for the same block id (a draft model's own K/V): counted
    # when sizing the cache and the swap pool, not part of this tensor's shape.
    extra_bytes_per_block: int = 0

    @property
    def bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_block(self) -> int:
        """K and V of block_size tokens over all layers (plus the extra bytes)."""
        return self.num_layers * self.block_size * self.bytes_per_token_layer + self.extra_bytes_per_block


def useful_block_cap(config: EngineConfig) -> int:
    """More blocks than every running request at full length could fill are never used."""
    per_seq = math.ceil(config.model.max_model_len / config.cache.block_size)
    return config.scheduler.max_num_seqs * per_seq


def num_blocks_for_budget(spec: KVCacheSpec, budget_bytes: int, config: EngineConfig) -> int:
    blocks = int(budget_bytes // spec.bytes_per_block)
    return min(blocks, useful_block_cap(config))


def cpu_num_blocks(spec: KVCacheSpec, config: EngineConfig) -> int:
    budget = int(config.cache.cpu_kv_cache_space_gib * _GIB)
    return num_blocks_for_budget(spec, budget, config)


def check_fits_one_sequence(num_blocks: int, config: EngineConfig) -> None:
    """The scheduler can always make progress only if one max-length request fits alone."""
    capacity = num_blocks * config.cache.block_size
    if capacity < config.model.max_model_len:
        needed = math.ceil(config.model.max_model_len / config.cache.block_size)
        # On the CPU gpu_memory_utilization sizes nothing: name the flag that does.
        budget = ("cpu_kv_cache_space (--cpu-kv-cache-space)" if config.device.device == "cpu"
                  else "gpu_memory_utilization (--gpu-memory-utilization)")
        raise ValueError(
            f"The KV cache holds {num_blocks} blocks ({capacity} tokens), fewer than one request "
            f"of max_model_len={config.model.max_model_len} needs ({needed} blocks). Lower "
            f"max_model_len, give the cache more room with {budget} or num_gpu_blocks_override, "
            "or use a smaller model/dtype."
        )


def allocate_kv_cache(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> torch.Tensor:
    """One tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim].

    A single allocation lets block copies and swaps move a block of every layer in one op.
    On a GPU it is zero-filled so never-written slots hold finite values; on the CPU it is left
    uninitialised so the OS commits pages only as tokens arrive (every read slot was written).
    """
    shape = (spec.num_layers, 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    if device.type == "cuda":
        return torch.zeros(shape, dtype=spec.dtype, device=device)
    return torch.empty(shape, dtype=spec.dtype, device=device)


def log_kv_cache_decision(num_blocks: int, spec: KVCacheSpec, config: EngineConfig, source: str) -> None:
    tokens = num_blocks * spec.block_size
    gib = num_blocks * spec.bytes_per_block / _GIB
    max_len = config.model.max_model_len
    logger.info(
        "KV cache: %d blocks of %d tokens (%d tokens, %.2f GiB, %s); max_model_len %d; "
        "up to %.1fx concurrency at full length",
        num_blocks,
        spec.block_size,
        tokens,
        gib,
        source,
        max_len,
        tokens / max_len,
    )
