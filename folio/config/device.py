"""DeviceConfig and ParallelConfig: where the model runs and over how many devices."""

from __future__ import annotations

from dataclasses import dataclass

DEVICES = ("auto", "cuda", "cpu")


def resolve_device(device: str) -> str:
    """'auto' is 'cuda' when torch sees a GPU, else 'cpu'."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}.")
    import torch  # config is above core/, so torch is allowed here

    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no visible CUDA device"
        raise ValueError(f"device='cuda' was asked for, but torch {torch.__version__} sees no GPU ({build}); "
                         "use device='cpu' or 'auto'.")
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "cpu"  # resolved: "cuda" or "cpu"

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be resolved to 'cuda' or 'cpu', got {self.device!r}.")


EXECUTOR_BACKENDS = ("mp",)


@dataclass(frozen=True)
class ParallelConfig:
    """How many ranks share the model, and how they meet (torch.distributed's rendezvous).

    Ranks are spread over `nnodes` machines with tensor_parallel_size // nnodes processes each;
    this process is on node `node_rank`. master_addr/master_port name rank 0's rendezvous
    (torchrun's MASTER_ADDR/MASTER_PORT); None means the environment's value, else (one node
    only) 127.0.0.1 and a free port chosen at start.
    """

    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    distributed_executor_backend: str | None = None  # None or "mp": one process per rank
    # Seconds a collective may wait on a peer before the engine gives up on it.
    collective_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        tp, nodes = self.tensor_parallel_size, self.nnodes
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}.")
        if not isinstance(nodes, int) or nodes < 1 or tp % nodes != 0:
            raise ValueError(f"nnodes must be a positive divisor of tensor_parallel_size ({tp}), got {nodes!r}.")
        if not 0 <= self.node_rank < nodes:
            raise ValueError(f"node_rank must be in [0, {nodes}), got {self.node_rank}.")
        if nodes > 1 and self.master_addr is None:
            raise ValueError("Several nodes need master_addr (rank 0's address, as torchrun's MASTER_ADDR).")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}.")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {EXECUTOR_BACKENDS} (or None), got {backend!r}."
            )
        if self.collective_timeout_s <= 0:
            raise ValueError(f"collective_timeout_s must be positive, got {self.collective_timeout_s}.")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        """The global ranks this node runs."""
        first = self.node_rank * self.ranks_per_node
        return range(first, first + self.ranks_per_node)
