"""Rendezvous: where the ranks meet, from ParallelConfig and torchrun's environment variables.

Precedence: an explicit ParallelConfig field, then torchrun's variable (MASTER_ADDR,
MASTER_PORT, NNODES, NODE_RANK / GROUP_RANK), then the one-node default: 127.0.0.1 and a free
port picked now (never a fixed one). Several nodes must agree on an address and a port, so they
need both given.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from folio.config import ParallelConfig


@dataclass(frozen=True)
class Rendezvous:
    """One rank's torchrun variables, typed."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int
    local_rank: int
    timeout_s: float

    def environ(self) -> dict[str, str]:
        """The torchrun variables that describe this rank."""
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
        }

    def for_rank(self, rank: int, local_rank: int) -> Rendezvous:
        return Rendezvous(self.master_addr, self.master_port, self.world_size, rank, local_rank, self.timeout_s)


def with_environment(config: ParallelConfig) -> ParallelConfig:
    """Fill the node and master fields the config leaves unset from torchrun's variables."""
    env = os.environ
    nnodes = config.nnodes if config.nnodes != 1 else int(env.get("NNODES", 1))
    node_rank = config.node_rank if config.node_rank != 0 else int(env.get("NODE_RANK", env.get("GROUP_RANK", 0)))
    port = config.master_port if config.master_port is not None else env.get("MASTER_PORT")
    return ParallelConfig(
        tensor_parallel_size=config.tensor_parallel_size,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=config.master_addr or env.get("MASTER_ADDR"),
        master_port=int(port) if port is not None else None,
        distributed_executor_backend=config.distributed_executor_backend,
        collective_timeout_s=config.collective_timeout_s,
    )


def resolve(config: ParallelConfig) -> Rendezvous:
    """The Rendezvous of this node's first rank (its other ranks: `for_rank`)."""
    config = with_environment(config)
    if config.nnodes > 1 and config.master_port is None:
        raise ValueError("Several nodes need master_port (or MASTER_PORT): every node must name the same one.")
    addr = config.master_addr or "127.0.0.1"
    port = config.master_port if config.master_port is not None else free_port(addr)
    first = config.local_ranks.start
    return Rendezvous(addr, port, config.tensor_parallel_size, first, 0, config.collective_timeout_s)


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS's pick); rank 0's store binds it moments later."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])
