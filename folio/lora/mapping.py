"""LoRAMapping: which GPU slot each token of a step uses, grouped and blocked for the kernels.

Built on the host with numpy from the per-token slots (-1 = no adapter), written into the
persistent buffers of LoRAMappingBuffers (the same addresses every step, so a captured CUDA graph
reads each step's mapping), and read by every LoRA layer of the model during the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from folio.kernels.lora_shrink import LoRABlocks, num_blocks, plan_blocks


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
    # [tokens] int32: tokens with an adapter grouped by slot, then those without (padding too)
    sorted_tokens: torch.Tensor
    blocks: LoRABlocks  # the shrink/expand blocks: the adapter groups (lora_shrink.plan_blocks)
    # The fused gate/up activation's blocks: the same groups plus the no-adapter group (its slot
    # is max_loras), so every token is in exactly one block (kernels/lora_silu_and_mul.py).
    act_blocks: LoRABlocks
    any_adapter: bool  # host-side: whether any token of the step has an adapter


class LoRAMappingBuffers:
    """Persistent host (pinned on a GPU) and device buffers for the step's mapping."""

    def __init__(self, max_num_tokens: int, max_loras: int, device: torch.device) -> None:
        self.max_loras = max_loras
        self.device = device
        pin = device.type == "cuda"
        max_blocks = -(-max_num_tokens // 16) + max_loras + 1  # >= num_blocks(tokens, max_loras + 1)
        sizes = {"token_slots": max_num_tokens, "sorted_tokens": max_num_tokens,
                 "block_slots": max_blocks, "block_starts": max_blocks, "block_ends": max_blocks,
                 "act_block_slots": max_blocks, "act_block_starts": max_blocks, "act_block_ends": max_blocks}
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
        sorted_tokens, _, counts = group_tokens_by_slot(token_slots, self.max_loras)
        without = np.concatenate((np.flatnonzero(np.asarray(token_slots) < 0), np.arange(n, padded_tokens)))
        h["sorted_tokens"][:padded_tokens] = np.concatenate((sorted_tokens, without))
        n_blocks = num_blocks(padded_tokens, self.max_loras)
        for name, values in zip(("block_slots", "block_starts", "block_ends"), plan_blocks(counts, padded_tokens)):
            h[name][:n_blocks] = values
        n_act = num_blocks(padded_tokens, self.max_loras + 1)
        act = plan_blocks(np.append(counts, len(without)), padded_tokens)
        for name, values in zip(("act_block_slots", "act_block_starts", "act_block_ends"), act):
            h[name][:n_act] = values
        d = self.device_tensors
        for name, size in (("token_slots", padded_tokens), ("sorted_tokens", padded_tokens),
                           ("block_slots", n_blocks), ("block_starts", n_blocks), ("block_ends", n_blocks),
                           ("act_block_slots", n_act), ("act_block_starts", n_act), ("act_block_ends", n_act)):
            d[name][:size].copy_(self.host[name][:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.current = LoRAMapping(
            d["token_slots"][:padded_tokens], d["sorted_tokens"],
            LoRABlocks(d["block_slots"], d["block_starts"], d["block_ends"]),
            LoRABlocks(d["act_block_slots"], d["act_block_starts"], d["act_block_ends"]),
            any_adapter=bool(len(sorted_tokens)) or for_graph,
        )
        return self.current
