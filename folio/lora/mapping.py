"""LoRAMapping: which GPU slot each token of a step uses, grouped by slot for the kernels.

Built on the host with numpy from the per-token slots (-1 = no adapter), written into the
persistent buffers of LoRAMappingBuffers (the same addresses every step, so a captured CUDA graph
reads each step's mapping), and read by every LoRA layer of the model during the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def group_tokens_by_slot(token_slots: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted_tokens, slot_starts, slot_counts): the indices of tokens with an adapter, grouped
    by slot in token order, where each slot's group starts and how long it is. Tokens with
    slot -1 appear nowhere."""
    slots = np.asarray(token_slots, dtype=np.int64)
    counts = np.bincount(slots[slots >= 0], minlength=num_slots)[:num_slots]  # [num_slots]
    starts = np.zeros(num_slots, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    order = np.argsort(np.where(slots >= 0, slots, num_slots), kind="stable")  # -1 sorts last
    return order[: int(counts.sum())], starts, counts


@dataclass(frozen=True)
class LoRAMapping:
    """Device tensors of one step (views of the persistent buffers)."""

    token_slots: torch.Tensor  # [tokens] int32, -1 = no adapter
    sorted_tokens: torch.Tensor  # [tokens] int32 (a prefix is used: tokens with an adapter)
    slot_starts: torch.Tensor  # [max_loras] int32
    slot_counts: torch.Tensor  # [max_loras] int32
    any_adapter: bool  # host-side: whether any token of the step has an adapter


class LoRAMappingBuffers:
    """Persistent host (pinned on a GPU) and device buffers for the step's mapping."""

    def __init__(self, max_num_tokens: int, max_loras: int, device: torch.device) -> None:
        self.max_loras = max_loras
        self.device = device
        pin = device.type == "cuda"
        sizes = {"token_slots": max_num_tokens, "sorted_tokens": max_num_tokens,
                 "slot_starts": max_loras, "slot_counts": max_loras}
        self.host = {k: torch.zeros(n, dtype=torch.int32, pin_memory=pin) for k, n in sizes.items()}
        self.device_tensors = {k: torch.zeros(n, dtype=torch.int32, device=device) for k, n in sizes.items()}
        # Host buffers are rewritten each step: wait until last step's copies have left them.
        self._copied = torch.cuda.Event() if pin else None
        self.current = self.write(np.full(0, -1), 0)

    def write(self, token_slots: np.ndarray, padded_tokens: int, for_graph: bool = False) -> LoRAMapping:
        """Fill the buffers from per-token slots (padding tokens get -1); returns the mapping.
        for_graph: a CUDA-graph capture (or its warm-up), which must launch the kernels even
        though no token has an adapter, so that replays with adapters run them."""
        if self._copied is not None:
            self._copied.synchronize()
        n = len(token_slots)
        h = {k: v.numpy() for k, v in self.host.items()}
        h["token_slots"][:n] = token_slots
        h["token_slots"][n:padded_tokens] = -1
        sorted_tokens, starts, counts = group_tokens_by_slot(token_slots, self.max_loras)
        h["sorted_tokens"][: len(sorted_tokens)] = sorted_tokens
        h["slot_starts"][:] = starts
        h["slot_counts"][:] = counts
        d = self.device_tensors
        for name, size in (("token_slots", padded_tokens), ("sorted_tokens", len(sorted_tokens)),
                           ("slot_starts", self.max_loras), ("slot_counts", self.max_loras)):
            d[name][:size].copy_(self.host[name][:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.current = LoRAMapping(
            d["token_slots"][:padded_tokens], d["sorted_tokens"], d["slot_starts"], d["slot_counts"],
            any_adapter=bool(len(sorted_tokens)) or for_graph,
        )
        return self.current
