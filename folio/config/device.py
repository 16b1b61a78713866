"""DeviceConfig and ParallelConfig: where the model runs and over how many devices."""

from __future__ import annotations

from dataclasses import dataclass

DEVICES = ("auto", "cuda", "cpu")


def resolve_device(device: str) -> str:
    """'auto' is 'cuda' when torch sees a GPU, else 'cpu'."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}.")
    if device != "auto":
        return device
    import torch  # config is above core/, so torch is allowed here

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "cpu"  # resolved: "cuda" or "cpu"

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be resolved to 'cuda' or 'cpu', got {self.device!r}.")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size > 1 is not supported yet.")
