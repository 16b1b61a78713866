"""LoRAManager: adapters on the CPU (an LRU of max_cpu_loras) and in GPU slots (max_loras).

- `wrap(model)` replaces each adaptable linear layer (q/k/v/o/gate/up/down, merged or not) by a
  LoRALinear around it, once, after the weights are loaded.
- `add_adapter(request)` reads and checks a PEFT folder into the CPU cache (ValueError for a bad
  adapter: the engine calls it when a request arrives, so a bad adapter is the request's error,
  never the step's). The LRU never pushes out the copy of an adapter that unfinished requests
  use (`in_use`); a copy pushed out is read from its folder again when a new request needs it.
- `activate(requests)` puts a step's adapters into slots: those already in one stay, the others
  take a free slot or the least recently used one not needed this step. The scheduler never
  mixes more than max_loras adapters in a step (core/lora_slots.py), so a slot always exists.
  Slot writes are queued on the device's stream like everything else, so a step still in flight
  (async scheduling) reads a slot's old adapter before a later step's write replaces it.
- `set_token_slots(...)` writes the step's per-token slots into the persistent mapping buffers
  that every LoRALinear reads (the same addresses every step, as CUDA graphs need).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from folio.config.lora import LoRAConfig
from folio.core.scheduler_output import ScheduledRequest
from folio.logger import init_logger
from folio.lora.adapter import LoRAAdapter, load_adapter
from folio.lora.layers import LoRALinear
from folio.lora.mapping import LoRAMapping, LoRAMappingBuffers
from folio.lora.request import LoRARequest
from folio.lora.targets import LoRATarget, adaptable_shards, lora_targets

logger = init_logger(__name__)


class LoRAManager:
    def __init__(self, config: LoRAConfig, max_num_tokens: int, device: torch.device, dtype: torch.dtype) -> None:
        self.config = config
        self.dtype = dtype
        self.buffers = LoRAMappingBuffers(max_num_tokens, config.max_loras, device)
        self.layers: dict[str, LoRALinear] = {}  # folio layer name -> wrapper
        self.targets: dict[str, LoRATarget] = {}  # PEFT module name -> where it lands
        self.cpu: OrderedDict[int, LoRAAdapter] = OrderedDict()  # id -> adapter, least recent first
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # id -> slot, least recent first
        self.slot_request: dict[int, LoRARequest] = {}  # id -> the adapter its slot holds
        self.num_slot_loads = 0  # adapters copied into a slot since start
        # The ids unfinished requests use (the engine sets it): their CPU copies are kept.
        self.in_use: Callable[[], set[int]] = set

    # ---- the model ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module) -> None:
        """Wrap every adaptable linear layer of the (loaded) model in a LoRALinear."""
        self.targets = lora_targets(model.named_modules())
        if not self.targets:
            raise ValueError(f"{type(model).__name__} has no layers folio can apply LoRA adapters to.")
        found = [(name, module) for name, module in model.named_modules() if adaptable_shards(name, module)]
        for name, module in found:
            wrapper = LoRALinear(module, adaptable_shards(name, module), self.config.max_loras,
                                 self.config.max_lora_rank, self.current_mapping, self.dtype)
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, wrapper)
            self.layers[name] = wrapper
        stacked = sum(layer.stacked_weight is not None for layer in self.layers.values())
        logger.info("LoRA: %d layers adaptable (%d with A stacked under the base weight, the rest through the "
                    "shrink kernel), %d GPU slots of rank %d, %d adapters kept on the CPU", len(self.layers), stacked,
                    self.config.max_loras, self.config.max_lora_rank, self.config.cpu_capacity)

    def current_mapping(self) -> LoRAMapping:
        return self.buffers.current

    # ---- adapters on the CPU ------------------------------------------------------------------
    def add_adapter(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter's CPU copy, read from its folder if not cached (ValueError if unusable)."""
        # An id names one adapter while it is held anywhere: a slot outlives its CPU copy.
        held = self.cpu.get(request.lora_int_id)
        known = held.request if held is not None else self.slot_request.get(request.lora_int_id)
        if known is not None and (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
            raise ValueError(
                f"lora_int_id {request.lora_int_id} is already used by adapter "
                f"{known.lora_name!r} ({known.lora_path}); each adapter needs its own id."
            )
        if held is not None:
            self.cpu.move_to_end(request.lora_int_id)
            return held
        adapter = load_adapter(request, self.targets, self.config.max_lora_rank, self.dtype)
        self.cpu[request.lora_int_id] = adapter
        self._trim_cpu_cache(keep=request.lora_int_id)  # its request is not queued yet
        logger.info("LoRA: loaded adapter %r (id %d, rank %d, %d modules)", request.lora_name,
                    request.lora_int_id, adapter.rank, len(adapter.modules))
        return adapter

    def _trim_cpu_cache(self, keep: int) -> None:
        """Drop least recent CPU copies past max_cpu_loras, but none that unfinished requests
        use: their slot is filled from it later, and a folder read then (gone or changed since)
        would fail the whole step. While they run the cache may hold more than max_cpu_loras."""
        excess = len(self.cpu) - self.config.cpu_capacity
        if excess <= 0:
            return
        in_use = self.in_use() | {keep}
        for lora_id in [i for i in self.cpu if i not in in_use][:excess]:
            del self.cpu[lora_id]
            logger.debug("LoRA: adapter id %d dropped from the CPU cache", lora_id)

    def remove_adapter(self, lora_int_id: int) -> bool:
        """Forget an adapter (unload): its CPU copy and its slot. False if it was not loaded."""
        found = self.cpu.pop(lora_int_id, None) is not None
        slot = self.slot_of.pop(lora_int_id, None)
        self.slot_request.pop(lora_int_id, None)
        if slot is not None:
            for layer in self.layers.values():
                layer.clear_slot(slot)
        return found or slot is not None

    def list_adapters(self) -> list[LoRARequest]:
        return [adapter.request for adapter in self.cpu.values()]

    # ---- GPU slots ----------------------------------------------------------------------------
    def activate(self, requests: Iterable[LoRARequest]) -> dict[int, int]:
        """Slots for this step's adapters: lora_int_id -> slot."""
        wanted = {r.lora_int_id: r for r in requests}
        if len(wanted) > self.config.max_loras:
            raise ValueError(f"A step uses {len(wanted)} adapters, more than max_loras={self.config.max_loras}.")
        for lora_id in wanted:
            if lora_id in self.slot_of:
                self.slot_of.move_to_end(lora_id)
        for lora_id, request in wanted.items():
            if lora_id not in self.slot_of:
                self._load_into_slot(request, self._free_slot(wanted))
        return {lora_id: self.slot_of[lora_id] for lora_id in wanted}

    def _free_slot(self, keep: dict[int, LoRARequest]) -> int:
        used = set(self.slot_of.values())
        for slot in range(self.config.max_loras):
            if slot not in used:
                return slot
        victim = next(lora_id for lora_id in self.slot_of if lora_id not in keep)  # least recent
        self.slot_request.pop(victim, None)
        return self.slot_of.pop(victim)

    def _load_into_slot(self, request: LoRARequest, slot: int) -> None:
        adapter = self.add_adapter(request)
        for name, layer in self.layers.items():
            layer.set_slot(slot, adapter, name.rpartition(".")[0])
        self.slot_of[request.lora_int_id] = slot
        self.slot_request[request.lora_int_id] = adapter.request
        self.num_slot_loads += 1

    def prepare_step(self, scheduled: list[ScheduledRequest], padded_tokens: int) -> LoRAMapping:
        """Activate the step's adapters and write each token's slot (-1: base model)."""
        requests = [s.request.lora_request for s in scheduled]
        if not any(requests):
            return self.buffers.write(np.empty(0, dtype=np.int64), padded_tokens)
        slot_of = self.activate(r for r in requests if r is not None)
        per_seq = np.fromiter((slot_of[r.lora_int_id] if r else -1 for r in requests), np.int64, len(requests))
        counts = np.fromiter((s.num_new_tokens for s in scheduled), np.int64, len(scheduled))
        return self.buffers.write(np.repeat(per_seq, counts), padded_tokens)

    @contextmanager
    def base_model_only(self) -> Iterator[None]:
        """A forward outside the steps (the pooler's) runs the base model: the last step's
        per-token slots would otherwise be applied to tokens they do not describe. The buffers
        are left as they are (a step still in flight, or prepared, reads them)."""
        saved = self.buffers.current
        self.buffers.current = replace(saved, any_adapter=False)
        try:
            yield
        finally:
            self.buffers.current = saved

    def prepare_capture(self, padded_tokens: int, with_kernels: bool = True) -> LoRAMapping:
        """The mapping a CUDA graph is captured with: no adapters, and the kernels launched
        anyway (with_kernels: the graph replayed for steps with adapters) or not at all (the
        graph replayed for steps without any)."""
        return self.buffers.write(np.empty(0, dtype=np.int64), padded_tokens, for_graph=with_kernels)
