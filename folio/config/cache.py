"""CacheConfig: how the paged KV cache is laid out and sized."""

from __future__ import annotations

import math
from dataclasses import dataclass

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block, for every layer
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory folio may use in all
    num_gpu_blocks_override: int | None = None  # exact block count (tests, tuning)
    cpu_kv_cache_space_gib: float = 4.0  # KV budget when the model runs on the CPU
    swap_space_gib: float = 4.0  # CPU memory for swapped-out blocks (preemption by swap)
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"  # "auto": the model dtype; "fp8": e4m3 with per-tensor k/v scales

    @property
    def fp8(self) -> bool:
        return self.cache_dtype in ("fp8", "fp8_e4m3")

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise ValueError(f"block_size must be an integer, got {self.block_size!r}.")
        if self.block_size < 1 or self.block_size > 256 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two in [1, 256], got {self.block_size}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}."
            )
        if self.num_gpu_blocks_override is not None and (
            not isinstance(self.num_gpu_blocks_override, int) or self.num_gpu_blocks_override < 1
        ):
            raise ValueError(
                "num_gpu_blocks_override must be a positive integer, "
                f"got {self.num_gpu_blocks_override!r}."
            )
        _check_gib("cpu_kv_cache_space", self.cpu_kv_cache_space_gib, zero_ok=False)
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.cache_dtype!r}.")
        _check_gib("swap_space", self.swap_space_gib, zero_ok=True)


def _check_gib(name: str, value: object, zero_ok: bool) -> None:
    """A size in GiB, named as the user wrote it (the field names add _gib): inf overflowed and
    NaN failed an int() conversion deep in the worker, naming nothing."""
    flag = "--" + name.replace("_", "-")
    what = "non-negative" if zero_ok else "positive"
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} ({flag}) must be a finite, {what} number of GiB, got {value!r}.")
