"""The tensor-parallel process group: joined once per process, torchrun-compatible.

Every rank calls `join_group` with the same Rendezvous; torch.distributed's TCP store on
master_addr:master_port (torchrun's MASTER_ADDR/MASTER_PORT) is the only meeting protocol.
Two groups over the same ranks: the model's collectives, with a timeout, and the step plans,
without one (a follower waits on the next plan as long as the engine idles).
NCCL on CUDA, gloo on the CPU. The group spans the whole world: one engine = one model.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
import os
import threading
import time

import torch
import torch.distributed as dist

from folio.logger import init_logger, set_log_rank
from folio.parallel.rendezvous import Rendezvous

logger = init_logger(__name__)

# The tensor-parallel peers of this process; None while running on one device.
_TP_GROUP: dist.ProcessGroup | None = None
# The same ranks, for step plans only: a follower waits on it for as long as the engine idles,
# so it has no practical timeout (a dead peer is caught by the process watchers instead).
_PLAN_GROUP: dist.ProcessGroup | None = None
_PLAN_TIMEOUT = datetime.timedelta(days=365)
_STARTUP_TIMEOUT_S = 600.0  # every rank must reach the rendezvous within this
_ENV_BEFORE: dict[str, str | None] = {}  # the torchrun variables join_group replaced


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def join_group(rendezvous: Rendezvous, device: str, alive: Callable[[], None] | None = None) -> None:
    """Initialise torch.distributed for this rank (blocks until every rank has joined).

    alive (rank 0): called while the ranks gather; it raises if a worker has died, which ends
    the wait at once instead of after the start-up timeout (a worker that fails on import never
    joins: e.g. a script without an `if __name__ == "__main__":` guard)."""
    if _TP_GROUP is not None:
        raise RuntimeError("This process already belongs to a tensor-parallel group.")
    for key in rendezvous.environ():  # the values before any group of this process set them
        _ENV_BEFORE.setdefault(key, os.environ.get(key))
    os.environ.update(rendezvous.environ())  # torchrun's variables, for torch; leave_group undoes it
    try:
        _join(rendezvous, device, alive)
    except BaseException:
        # A start that failed (a worker died, the store's port was taken, the timeout) leaves
        # nothing behind: a retry in this process must pick its own port, not this one.
        _undo_join(10.0)
        raise


def _join(rendezvous: Rendezvous, device: str, alive: Callable[[], None] | None) -> None:
    global _TP_GROUP, _PLAN_GROUP
    if device == "cuda":
        torch.cuda.set_device(rendezvous.local_rank)
    set_log_rank(rendezvous.rank)
    # Rendezvous through torch's TCP store, bounded by the start-up timeout; the world group
    # (step plans) is untimed, the model's collectives get collective_timeout_s.
    timeout_s = max(rendezvous.timeout_s, _STARTUP_TIMEOUT_S)
    store = dist.TCPStore(
        rendezvous.master_addr,
        rendezvous.master_port,
        rendezvous.world_size,
        is_master=rendezvous.rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,  # _gather's count waits instead, watching the workers
    )
    _gather(store, rendezvous, timeout_s, alive)
    dist.init_process_group(
        backend=backend_for(device),
        store=store,
        world_size=rendezvous.world_size,
        rank=rendezvous.rank,
        timeout=_PLAN_TIMEOUT,
        device_id=torch.device("cuda", rendezvous.local_rank) if device == "cuda" else None,
    )
    _PLAN_GROUP = dist.group.WORLD
    _TP_GROUP = dist.new_group(timeout=datetime.timedelta(seconds=rendezvous.timeout_s))
    logger.info(
        "Joined the tensor-parallel group: rank %d of %d (%s, %s:%d)",
        rendezvous.rank,
        rendezvous.world_size,
        backend_for(device),
        rendezvous.master_addr,
        rendezvous.master_port,
    )


_JOINED_KEY = "folio/ranks-joined"


def _gather(store: dist.TCPStore, rendezvous: Rendezvous, timeout_s: float, alive: Callable[[], None] | None) -> None:
    """Each rank counts itself in; rank 0 waits for all of them, calling alive() between looks."""
    store.add(_JOINED_KEY, 1)
    if rendezvous.rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    while (joined := store.add(_JOINED_KEY, 0)) < rendezvous.world_size:
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"Tensor-parallel start-up: {joined} of {rendezvous.world_size} ranks joined "
                               f"{rendezvous.master_addr}:{rendezvous.master_port} within {timeout_s:.0f} s.")
        time.sleep(0.05)


def leave_group(timeout_s: float = 10.0) -> None:
    """Leave the group (idempotent), so a later engine in this process can join anew.

    gloo is destroyed. NCCL is aborted (a destroy waits on every rank's teardown, forever after
    a peer died). Either runs on a helper thread for at most timeout_s: a teardown that blocks
    is logged and abandoned rather than hanging the engine's shutdown.
    """
    if _TP_GROUP is not None:
        _undo_join(timeout_s)


def _undo_join(timeout_s: float) -> None:
    """Forget the group, tear down what torch.distributed holds, and restore the environment:
    the end of a group, or of a join that failed part-way."""
    global _TP_GROUP, _PLAN_GROUP
    _TP_GROUP = _PLAN_GROUP = None
    if dist.is_initialized():
        run_bounded(_tear_down, timeout_s, "the process group's teardown")
    set_log_rank(None)
    _restore_environment()


def _restore_environment() -> None:
    """The torchrun variables as they were before join_group: a later engine in this process, or
    a child it starts, must not take this group's MASTER_PORT for its own."""
    for key, value in _ENV_BEFORE.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _ENV_BEFORE.clear()


def run_bounded(fn: Callable[[], None], timeout_s: float, what: str) -> None:
    """fn() on a helper thread, waited for at most timeout_s (then logged and abandoned).
    Inline at interpreter shutdown, where Python 3.12 refuses new threads."""
    try:
        thread = threading.Thread(target=fn, name="folio-tp-bounded", daemon=True)
        thread.start()
    except RuntimeError:
        fn()
        return
    thread.join(timeout_s)
    if thread.is_alive():
        logger.warning("%s did not finish in %.0f s; going on without it.", what.capitalize(), timeout_s)


def _tear_down() -> None:
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.get_backend() != "gloo" and abort is not None:
        abort()  # frees the communicators without waiting on peers
    if dist.is_initialized():
        dist.destroy_process_group()  # the group bookkeeping (immediate after an abort)


def get_tp_group() -> dist.ProcessGroup | None:
    return _TP_GROUP


def get_plan_group() -> dist.ProcessGroup | None:
    return _PLAN_GROUP


def get_tp_rank() -> int:
    return 0 if _TP_GROUP is None else dist.get_rank(_TP_GROUP)


def get_tp_size() -> int:
    return 1 if _TP_GROUP is None else dist.get_world_size(_TP_GROUP)
