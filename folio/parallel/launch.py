"""Starting and stopping tensor parallelism around an engine, and headless follower nodes.

`lead` (the engine's process, rank 0 of node 0): start this node's workers, then join the group.
`serve_node` (nodes 1 .. nnodes-1): run this node's ranks and wait for rank 0 to stop them;
the same command line as node 0 with --node-rank set (docs/tensor-parallel.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from folio.config import EngineConfig, ParallelConfig
from folio.logger import init_logger
from folio.parallel import rendezvous as rdv
from folio.parallel.group import join_group, leave_group, run_bounded
from folio.parallel.workers import WorkerGroup, run_follower

logger = init_logger(__name__)

_STOP_TIMEOUT_S = 30.0


@dataclass
class Lead:
    """Rank 0's hold on the group: its workers, and how to let them go."""

    workers: WorkerGroup
    device: torch.device

    def stop(self, send_stop: Callable[[], None]) -> None:
        """Stop the followers, leave the group, then wait for the workers.

        send_stop is the runner's shutdown_followers (broadcasts stop, frees its CUDA graphs).
        Rank 0 leaves before it waits, so no teardown of its own waits on a worker.
        """
        self.workers.expect_exit()
        # Bounded: a stop that blocks on the device must not hang; the workers are ended below.
        run_bounded(lambda: self._leave(send_stop), _STOP_TIMEOUT_S, "stopping the tensor-parallel group")
        self.workers.stop()

    def _leave(self, send_stop: Callable[[], None]) -> None:
        try:
            if self.workers.failure is None:
                send_stop()
                if self.device.type == "cuda":
                    torch.cuda.synchronize()  # the stop has left before the communicator goes
        except Exception as e:  # noqa: BLE001 - a dead peer: the workers are terminated after
            logger.warning("Could not tell the workers to stop: %s", e)
        leave_group()

    def abandon(self) -> None:
        """Start-up failed on rank 0: end the workers without talking to them."""
        self.workers.terminate()
        leave_group()


def lead(config: EngineConfig) -> Lead:
    """Start this node's workers and join the group as rank 0 (blocks until all have joined)."""
    parallel = rdv.with_environment(config.parallel)
    if parallel.node_rank != 0:
        raise ValueError("Only node 0 runs the engine; other nodes run `serve_node` (folio serve --node-rank N).")
    rendezvous = rdv.resolve(parallel)
    config = _with_parallel(config, parallel)
    workers = WorkerGroup(config, rendezvous)
    try:
        join_group(rendezvous, config.device.device, alive=workers.check)
    except BaseException:
        workers.terminate()
        raise
    return Lead(workers, torch.device(config.device.device))


def serve_node(config: EngineConfig) -> int:
    """A node past the first: its ranks follow rank 0 until it stops them. Returns an exit code."""
    parallel = rdv.with_environment(config.parallel)
    rendezvous = rdv.resolve(parallel)
    config = _with_parallel(config, parallel)
    workers = WorkerGroup(config, rendezvous)
    try:
        run_follower(config, rendezvous, exit_when_done=False)
    except BaseException:
        workers.terminate()
        raise
    workers.stop()
    return 1 if workers.failure else 0


def _with_parallel(config: EngineConfig, parallel: ParallelConfig) -> EngineConfig:
    return replace(config, parallel=parallel)
