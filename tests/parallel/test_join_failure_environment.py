"""A tensor-parallel start that fails on rank 0 (a worker died before joining, the wait timed
out) leaves os.environ as it found it. join_group used to write the torchrun variables and only
leave_group (never reached: the group was not joined) put them back, so a retry in the same
process took the failed group's MASTER_PORT (rendezvous.with_environment reads it), and the
next join recorded those stale values as the ones to restore."""

from __future__ import annotations

import os

import pytest

from folio.config import ParallelConfig
from folio.parallel import group
from folio.parallel import rendezvous as rdv

TORCHRUN = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")


class WorkerDied(RuntimeError):
    pass


def _dead() -> None:
    raise WorkerDied("rank 1 died before joining")


@pytest.fixture
def clean_env(monkeypatch):
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    yield
    group._ENV_BEFORE.clear()


def _fail_once() -> int:
    rendezvous = rdv.resolve(ParallelConfig(tensor_parallel_size=2))
    with pytest.raises(WorkerDied):
        group.join_group(rendezvous, "cpu", alive=_dead)
    return rendezvous.master_port


def test_a_failed_join_restores_the_torchrun_variables(clean_env):
    _fail_once()
    assert {k: os.environ.get(k) for k in TORCHRUN} == dict.fromkeys(TORCHRUN)
    assert group.get_tp_group() is None and not group._ENV_BEFORE
    # a retry picks a port of its own, not the failed group's
    assert rdv.with_environment(ParallelConfig(tensor_parallel_size=2)).master_port is None
    _fail_once()  # a second failed start: still nothing left behind
    assert {k: os.environ.get(k) for k in TORCHRUN} == dict.fromkeys(TORCHRUN)


def test_a_failed_join_keeps_variables_the_user_set(clean_env, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(rdv.free_port()))
    before = {k: os.environ.get(k) for k in TORCHRUN}
    _fail_once()
    _fail_once()
    assert {k: os.environ.get(k) for k in TORCHRUN} == before
