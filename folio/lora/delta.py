"""The batched LoRA delta: y[t] += (x[t] @ A_i^T) @ B_i^T * scale_i for each token's adapter i.

`add_lora_delta` is what a LoRA layer calls: the Triton shrink + expand kernels on CUDA, their
torch references elsewhere. `lora_delta_reference` is the specification written the plain way
(one token at a time, scaling applied explicitly), which the kernels and the stacked-slot
layout are tested against.
"""

from __future__ import annotations

import torch

from folio.kernels.lora_expand import lora_expand_reference, lora_expand_triton
from folio.kernels.lora_shrink import lora_shrink_reference, lora_shrink_triton
from folio.kernels.triton_compat import use_triton_for
from folio.lora.mapping import LoRAMapping


def add_lora_delta(
    y: torch.Tensor,  # [tokens, N], updated in place
    x: torch.Tensor,  # [tokens, K]
    lora_a: torch.Tensor,  # [slots, shards * R, K]
    lora_b: torch.Tensor,  # [slots, N, R], scaling folded in
    mapping: LoRAMapping,
    shard_sizes: list[int],
    shard_offsets: torch.Tensor,  # [shards + 1] int32 on the device
) -> torch.Tensor:
    if not mapping.any_adapter:
        return y  # base-model tokens only, or a graph captured for such steps (prepare_capture)
    if use_triton_for(x):
        shrunk = lora_shrink_triton(x, lora_a, mapping.sorted_tokens, mapping.blocks, keep_splits=True)
        return lora_expand_triton(y, shrunk, lora_b, shard_offsets, mapping.sorted_tokens, mapping.blocks, shard_sizes)
    slots = mapping.token_slots[: x.shape[0]]
    shrunk = lora_shrink_reference(x, lora_a, slots)
    return lora_expand_reference(y, shrunk, lora_b, slots, shard_sizes)


def lora_delta_reference(
    x: torch.Tensor,  # [tokens, K]
    adapters: list[tuple[torch.Tensor, torch.Tensor, float]],  # (A [r, K], B [N, r], scale) each
    token_adapters: list[int],  # per token: an index into adapters, or -1 for none
) -> torch.Tensor:  # [tokens, N] float32, the delta alone
    """Token by token in float32: x A^T B^T * scale, zero for tokens without an adapter."""
    n = adapters[0][1].shape[0] if adapters else 0
    out = torch.zeros((x.shape[0], n), dtype=torch.float32)
    for t, i in enumerate(token_adapters):
        if i >= 0:
            a, b, scale = adapters[i]
            out[t] = (x[t].float().cpu() @ a.float().cpu().T) @ b.float().cpu().T * scale
    return out
