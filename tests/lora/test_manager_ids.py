"""LoRAManager bookkeeping on stand-in targets (no model): an id names one adapter for as long as
the manager holds it anywhere, on the CPU or in a GPU slot."""

from __future__ import annotations

import pytest
import torch

from folio.config.lora import LoRAConfig
from folio.lora.manager import LoRAManager
from folio.lora.request import LoRARequest
from tests.lora.test_adapter_loading import _targets, _write


def _manager() -> LoRAManager:
    manager = LoRAManager(LoRAConfig(max_loras=1, max_cpu_loras=1), 16, torch.device("cpu"), torch.float32)
    manager.targets = _targets()
    return manager


def test_an_id_still_in_a_slot_is_not_taken_by_another_adapter(tmp_path):
    for name in ("a", "b", "c"):
        _write(tmp_path / name)
    manager = _manager()
    first = LoRARequest("a", 1, str(tmp_path / "a"))
    manager.activate([first])  # slot 0 holds adapter a under id 1
    manager.add_adapter(LoRARequest("b", 2, str(tmp_path / "b")))  # pushes a's CPU copy out
    assert 1 not in manager.cpu and manager.slot_of == {1: 0}
    with pytest.raises(ValueError, match="already used by adapter 'a'"):
        manager.add_adapter(LoRARequest("c", 1, str(tmp_path / "c")))
    manager.add_adapter(first)  # the same adapter again is fine
    assert manager.activate([first]) == {1: 0}


def test_the_cpu_cache_keeps_adapters_in_use_and_the_newest(tmp_path):
    for name in ("a", "b", "c", "d"):
        _write(tmp_path / name)
    manager = _manager()
    manager.in_use = lambda: {1}
    manager.add_adapter(LoRARequest("a", 1, str(tmp_path / "a")))
    manager.add_adapter(LoRARequest("b", 2, str(tmp_path / "b")))  # over capacity: a is in use
    assert list(manager.cpu) == [1, 2]
    manager.in_use = lambda: {1, 2}
    manager.add_adapter(LoRARequest("c", 3, str(tmp_path / "c")))
    assert list(manager.cpu) == [1, 2, 3]
    manager.in_use = set  # all finished: the next load trims the cache back to max_cpu_loras
    manager.add_adapter(LoRARequest("d", 4, str(tmp_path / "d")))
    assert list(manager.cpu) == [4]
