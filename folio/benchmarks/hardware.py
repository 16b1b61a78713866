"""What the device can do, measured: device-to-device copy bandwidth and the bf16 matmul rate.

Copy bandwidth counts bytes read plus bytes written (a 1 GiB copy moves 2 GiB), the same way the
floor counts bytes. The matmul rate is an 8192^3 bf16 product (2 * 8192^3 FLOPs), the size at
which an H100 runs near its best. Both are the best of a few timed repetitions after warm-up.

On the CPU nothing is measured: a CPU run is for development, and its "floor" would say nothing
about the GPU engine (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

COPY_BYTES = 1 << 30  # 1 GiB source, 1 GiB destination
MATMUL_SIZE = 8192
_WARMUP = 3
_REPEATS = 10


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    copy_bandwidth: float  # bytes/s, read + written
    matmul_flops: float  # FLOP/s, bf16

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.name}: copy {self.copy_bandwidth / 1e12:.2f} TB/s (read + write), "
            f"bf16 matmul {self.matmul_flops / 1e12:.0f} TFLOP/s"
        )


def measure_device(device: str) -> DeviceLimits | None:
    """Measure a CUDA device; None for the CPU (no floor there)."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    try:
        limits = DeviceLimits(
            name=torch.cuda.get_device_name(dev),
            copy_bandwidth=_copy_bandwidth(dev),
            matmul_flops=_matmul_rate(dev),
        )
    finally:
        torch.cuda.empty_cache()
    return limits


def _best_seconds(fn: Any, dev: Any) -> float:
    """The fastest of _REPEATS timed calls of fn, after _WARMUP untimed ones."""
    import torch

    for _ in range(_WARMUP):
        fn()
    best = float("inf")
    for _ in range(_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(dev)
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def _copy_bandwidth(dev: Any) -> float:
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), dev)
    del src, dst
    return 2 * COPY_BYTES / seconds


def _matmul_rate(dev: Any) -> float:
    import torch

    n = MATMUL_SIZE
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
    seconds = _best_seconds(lambda: torch.matmul(a, b, out=out), dev)
    del a, b, out
    return 2 * n**3 / seconds
