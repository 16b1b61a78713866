"""WorkerGroup: the follower processes of this node, started and watched by the engine.

One spawned process per local rank (spawn, not fork: CUDA cannot be initialised twice in a
forked child). Startup data (the EngineConfig, the Rendezvous) crosses once, as spawn's
arguments; every step after that travels as StepPlan tensors over torch.distributed.

A watcher thread waits on the children's sentinels. When one dies before shutdown it logs
which rank died and how, records the failure (the engine raises it at its next step) and
terminates the others, so a collective rank 0 is blocked in fails at once instead of waiting
out its timeout. Under NCCL a collective does not notice a dead peer, so if the engine is stuck
in a step and has not surfaced the failure within `grace_s`, the watcher ends this process with
exit status 1. An idle engine raises the failure at its next step.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from folio.config import EngineConfig
from folio.logger import init_logger
from folio.parallel.rendezvous import Rendezvous

logger = init_logger(__name__)


# `folio serve` sets this: a server whose rank died exits (status 1) instead of answering errors.
_EXIT_ON_WORKER_DEATH = False


def exit_process_on_worker_death() -> None:
    global _EXIT_ON_WORKER_DEATH
    _EXIT_ON_WORKER_DEATH = True


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process ended while the engine was running."""


class WorkerGroup:
    def __init__(self, config: EngineConfig, rendezvous: Rendezvous, grace_s: float = 5.0) -> None:
        context = multiprocessing.get_context("spawn")
        self.grace_s = grace_s
        self.failure: str | None = None
        self.failure_seen = threading.Event()  # set by the engine once it raised the failure
        self._stopping = False
        self.busy = False  # the engine is inside a step (maybe blocked in a collective)
        self.processes: dict[int, multiprocessing.process.BaseProcess] = {}
        local_ranks = config.parallel.local_ranks
        for local_rank, rank in enumerate(local_ranks):
            if rank == rendezvous.rank:
                continue  # this process
            process = context.Process(
                target=run_follower,
                args=(config, rendezvous.for_rank(rank, local_rank)),
                name=f"folio-tp-rank-{rank}",
                daemon=True,
            )
            process.start()
            self.processes[rank] = process
        logger.info("Started %d tensor-parallel worker(s): %s", len(self.processes),
                    ", ".join(f"rank {r} pid {p.pid}" for r, p in self.processes.items()))
        self._watcher = threading.Thread(target=self._watch, name="folio-tp-watcher", daemon=True)
        self._watcher.start()

    def check(self, wait_s: float = 0.0) -> None:
        """Raise WorkerDiedError if a worker has died. wait_s: after a failed collective, give a
        death that caused it this long to show (the watcher may be reaping the process now)."""
        deadline = time.monotonic() + wait_s
        while self.failure is None and not self._stopping:
            dead = [(rank, p) for rank, p in self.processes.items() if p.exitcode is not None]
            if dead:
                self.failure = _death_message(*dead[0])
            elif time.monotonic() >= deadline:
                break
            else:
                time.sleep(0.05)
        if self.failure is not None:
            self.failure_seen.set()
            raise WorkerDiedError(self.failure)

    def expect_exit(self) -> None:
        """From now on a worker's exit is the shutdown, not a failure."""
        self._stopping = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the workers to leave (rank 0 sent them stop), terminating stragglers."""
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            process.join(max(deadline - time.monotonic(), 0.0))
        for rank, process in self.processes.items():
            if process.is_alive():  # SIGKILL: workers leave SIGTERM to rank 0 (_on_sigterm)
                logger.warning("Worker rank %d did not stop; killing it.", rank)
                process.kill()
                process.join()

    def terminate(self) -> None:
        """End every worker now (rank 0 failed, or a peer died)."""
        self._stopping = True
        for process in self.processes.values():
            if process.is_alive():
                process.kill()  # SIGKILL: workers leave SIGTERM to rank 0 (_on_sigterm)
        for process in self.processes.values():
            process.join(5.0)

    def _watch(self) -> None:
        alive = {p.sentinel: (rank, p) for rank, p in self.processes.items()}
        while alive:
            for sentinel in wait(list(alive)):
                rank, process = alive.pop(sentinel)
                if self._stopping:
                    continue
                process.join(1.0)
                self._fail(_death_message(rank, process))
                return

    def _fail(self, message: str) -> None:
        self.failure = self.failure or message
        logger.error("%s", self.failure)
        self.terminate()
        if _EXIT_ON_WORKER_DEATH:
            logging.shutdown()
            os._exit(1)
        if not self.failure_seen.wait(self.grace_s) and self.busy:
            logger.error("The engine did not stop within %.0f s of the worker's death; exiting.", self.grace_s)
            os._exit(1)


def _death_message(rank: int, process: multiprocessing.process.BaseProcess) -> str:
    return (f"Tensor-parallel worker rank {rank} (pid {process.pid}) died "
            f"({_describe_exit(process.exitcode)}); the engine cannot continue.")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_follower(config: EngineConfig, rendezvous: Rendezvous, exit_when_done: bool = True) -> None:
    """A worker's main: join the group, build this rank's runner and KV cache, follow rank 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: rank 0 decides
    signal.signal(signal.SIGTERM, _on_sigterm)  # so does systemd's SIGTERM: rank 0 stops us in order
    from folio.parallel.follower import Follower
    from folio.parallel.group import join_group, leave_group
    from folio.worker.model_runner import ModelRunner

    if config.device.device == "cpu":  # the node's ranks share its cores
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads() // config.parallel.ranks_per_node))
    join_group(rendezvous, config.device.device)
    _exit_when_orphaned()
    runner = ModelRunner(config)
    runner.initialize_kv_cache(runner.determine_num_blocks())
    Follower(runner).run()
    if not exit_when_done:  # a node's first rank, in its main process: the caller stops the rest
        runner.release_graphs()
        leave_group()
        return
    # Done: exit now, without tearing down the group or the interpreter (an NCCL teardown can
    # wait on peers; the process's exit frees all of it). A failure above raises with its traceback.
    logging.shutdown()
    os._exit(0)


def _on_sigterm(signum: int, frame: Any) -> None:
    """A worker's SIGTERM. Sent to the whole group (systemd, `timeout`), it reaches rank 0's server
    too, which finishes in-flight requests and then stops the workers in order: leave it to rank
    0 while it lives. A worker without a live parent (a node's first rank, started by hand)
    exits, as SIGTERM's default would have it; rank 0 ends stragglers with SIGKILL."""
    parent = multiprocessing.parent_process()
    if parent is None or not parent.is_alive():
        logging.shutdown()
        os._exit(0)


def _exit_when_orphaned() -> None:
    """A worker whose engine process died exits within a second (a follower may be blocked in
    a collective that would never end under NCCL)."""
    parent = multiprocessing.parent_process()
    if parent is None:  # a node's first rank, started by hand: nothing to watch
        return

    def watch() -> None:
        while parent.is_alive():
            time.sleep(0.5)
        logger.error("The engine process (rank 0) is gone; this worker exits.")
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=watch, name="folio-tp-orphan-watch", daemon=True).start()
