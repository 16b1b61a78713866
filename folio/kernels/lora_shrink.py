"""LoRA shrink: s[t] = x[t] @ A[slot[t]]^T for a batch whose tokens use different adapters.

The Punica / S-LoRA idea: adapters live stacked in GPU slots, A as [slots, R, K], and each token
carries the slot of its adapter (-1: none). The host groups the step's token indices by slot
(`sorted_tokens`) and cuts each slot's group into blocks of at most BLOCK_M tokens
(`plan_blocks`: per block its slot, and where it starts and its group ends in sorted_tokens), so
a program owns one block, all of ONE slot, and multiplies it by that slot's A with tensor-core
dots: a segmented GEMM, no per-token matrix-vector products. Tokens without an adapter are in no
block and cost nothing.

Grid: (cdiv(tokens, BLOCK_M) + slots, SPLIT_K): enough blocks for any mix of adapters, and a
function of the padded token count alone, so a CUDA graph captured for a decode batch size is
valid for every mix (unused blocks have slot -1 and return at once). Decode batches have few
tokens per slot and a long K, so the K loop is split over SPLIT_K programs writing partial
sums, added afterwards (no atomics: the result does not depend on the order programs finish in):
by one more launch, or by the expand / fused activation as they load the shrink (keep_splits).

For merged layers (QKV, gate/up) R stacks each shard's rank block: R = shards * r_max.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from folio.kernels.triton_compat import check_dtype, check_same_device, next_power_of_2, tl, triton

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def block_tokens(sorted_ptr, block_starts_ptr, block_ends_ptr, pid_b, BLOCK_M: tl.constexpr):
    """The token indices of block pid_b (all of one slot), and which lanes are real."""
    start = tl.load(block_starts_ptr + pid_b)
    end = tl.load(block_ends_ptr + pid_b)
    offs = start + tl.arange(0, BLOCK_M)
    mask = offs < end
    tokens = tl.load(sorted_ptr + offs, mask=mask, other=0).to(tl.int64)
    return tokens, mask


@triton.jit
def _lora_shrink_kernel(
    out_ptr,  # [SPLIT_K, tokens, R] float32
    x_ptr,  # [tokens, K]
    a_ptr,  # [slots, R, K]
    sorted_ptr,  # [tokens] int32: token indices grouped by slot
    block_slots_ptr,  # [blocks] int32: each block's slot, -1 = unused
    block_starts_ptr,  # [blocks] int32: where it starts in sorted_tokens
    block_ends_ptr,  # [blocks] int32: where its slot's group ends
    num_tokens,
    K,
    R,
    x_stride,
    a_stride_slot,
    a_stride_r,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_k = tl.program_id(1)
    slot = tl.load(block_slots_ptr + pid_b)
    if slot < 0:
        return
    tokens, mask_m = block_tokens(sorted_ptr, block_starts_ptr, block_ends_ptr, pid_b, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    a_base = a_ptr + slot.to(tl.int64) * a_stride_slot
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + tokens[:, None] * x_stride + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        a = tl.load(a_base + offs_r[:, None] * a_stride_r + offs_k[None, :], mask=mask_r[:, None] & mask_k[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(a), input_precision=PRECISION)  # [BLOCK_M, BLOCK_R]
    out = out_ptr + pid_k.to(tl.int64) * num_tokens * R + tokens[:, None] * R + offs_r[None, :]
    tl.store(out, acc, mask=mask_m[:, None] & mask_r[None, :])


def lora_shrink_triton(
    x: torch.Tensor,  # [tokens, K]
    lora_a: torch.Tensor,  # [slots, R, K]
    sorted_tokens: torch.Tensor,  # [tokens] int32
    blocks: LoRABlocks,  # plan_blocks(slot_counts, tokens) on the device
    split_k: int | None = None,
    keep_splits: bool = False,
) -> torch.Tensor:  # [tokens, R] float32; rows of tokens without an adapter are undefined
    """Triton launcher: checks shapes, picks tile sizes, sums the split-K partials; with
    keep_splits returns them unsummed, [split, tokens, R], for a consumer that adds them as it
    loads them (lora_expand, lora_silu_and_mul): one launch fewer per LoRA layer."""
    _check(x, lora_a, sorted_tokens, blocks)
    check_same_device(_lora_shrink_kernel, x=x, lora_a=lora_a, sorted_tokens=sorted_tokens)
    tokens, k = x.shape
    slots, r, _ = lora_a.shape
    split = split_k or _default_split(tokens, k)
    partial = torch.empty((split, tokens, r), dtype=torch.float32, device=x.device)
    if tokens == 0:
        return partial if keep_splits else partial.sum(0)
    grid = (num_blocks(tokens, slots), split)
    _lora_shrink_kernel[grid](
        partial,
        x,
        lora_a,
        sorted_tokens,
        blocks.slots,
        blocks.starts,
        blocks.ends,
        tokens,
        k,
        r,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        BLOCK_M=block_m(tokens),
        BLOCK_R=max(16, next_power_of_2(r)),
        BLOCK_K=64,
        SPLIT_K=split,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=4,
    )
    if keep_splits:
        return partial
    return partial[0] if split == 1 else partial.sum(0)


def sum_splits(shrunk: torch.Tensor) -> torch.Tensor:
    """[tokens, R] from a shrink result, summing kept split-K partials ([split, tokens, R]) in
    split order, as the consumers' loads do (float32, bit for bit)."""
    if shrunk.dim() == 2:
        return shrunk
    total = shrunk[0]
    for part in shrunk[1:]:
        total = total + part
    return total


def lora_shrink_reference(
    x: torch.Tensor,  # [tokens, K]
    lora_a: torch.Tensor,  # [slots, R, K]
    token_slots: torch.Tensor,  # [tokens] int, -1 = no adapter
) -> torch.Tensor:  # [tokens, R] float32, zero for tokens without an adapter
    """Plain torch, one matmul per slot, masked to that slot's tokens: nothing is read back
    to the host, so the plain path (FOLIO_TRITON_KERNELS=0) also runs inside CUDA graphs."""
    out = torch.zeros((x.shape[0], lora_a.shape[1]), dtype=torch.float32, device=x.device)
    xf = x.float()
    for slot in range(lora_a.shape[0]):
        mask = (token_slots == slot).unsqueeze(1)  # [tokens, 1]
        out = torch.where(mask, xf @ lora_a[slot].float().T, out)  # [tokens, R]
    return out


class LoRABlocks(NamedTuple):
    """Per block of at most block_m tokens of one slot: slot (-1 unused), start, group end."""

    slots: torch.Tensor  # [>= num_blocks] int32
    starts: torch.Tensor  # [>= num_blocks] int32
    ends: torch.Tensor  # [>= num_blocks] int32


def block_m(tokens: int) -> int:
    """Tokens per block: small for decode batches (few tokens per slot), larger for prefill."""
    return 16 if tokens <= 1024 else 64


def num_blocks(tokens: int, slots: int) -> int:
    """Blocks the grid launches: enough for any split of `tokens` over `slots` groups."""
    return -(-tokens // block_m(tokens)) + slots


def plan_blocks(slot_counts: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slots, starts, ends) of every block, padded with slot -1 to num_blocks(tokens, slots):
    the groups of sorted_tokens (in slot order, slot_counts long each) cut into block_m pieces."""
    counts = np.asarray(slot_counts, dtype=np.int64)
    size, total = block_m(tokens), num_blocks(tokens, len(counts))
    group_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    per_slot = -(-counts // size)  # blocks of each slot
    slots = np.repeat(np.arange(len(counts)), per_slot)
    first = np.repeat(np.cumsum(per_slot) - per_slot, per_slot)
    starts = np.repeat(group_starts, per_slot) + (np.arange(len(slots)) - first) * size
    ends = np.repeat(group_starts + counts, per_slot)
    pad = total - len(slots)
    return (np.concatenate((slots, np.full(pad, -1))), np.concatenate((starts, np.zeros(pad, np.int64))),
            np.concatenate((ends, np.zeros(pad, np.int64))))


def _default_split(tokens: int, k: int) -> int:
    """Few tokens per slot (decode): split the K loop so more programs share the reads of A."""
    if tokens > 512:
        return 1
    return max(1, min(8, k // 512))


def _check(x, lora_a, sorted_tokens, blocks) -> None:
    check_dtype("x", x, _FLOATS)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [tokens, K] with contiguous rows, got {tuple(x.shape)}.")
    if lora_a.dim() != 3 or lora_a.shape[2] != x.shape[1] or not lora_a.is_contiguous():
        raise ValueError(f"lora_a must be a contiguous [slots, R, {x.shape[1]}], got {tuple(lora_a.shape)}.")
    if lora_a.dtype != x.dtype:
        raise ValueError(f"lora_a must have x's dtype {x.dtype}, got {lora_a.dtype}.")
    if lora_a.shape[1] > 256:
        raise ValueError(f"at most 256 stacked rank rows are supported, got {lora_a.shape[1]}.")
    check_mapping(x.shape[0], lora_a.shape[0], sorted_tokens, blocks)


def check_mapping(tokens: int, slots: int, sorted_tokens: torch.Tensor, blocks: LoRABlocks) -> None:
    n_blocks = num_blocks(tokens, slots)
    for name, t, n in (("sorted_tokens", sorted_tokens, tokens), ("block slots", blocks.slots, n_blocks),
                       ("block starts", blocks.starts, n_blocks), ("block ends", blocks.ends, n_blocks)):
        if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] < n:
            raise ValueError(f"{name} must be int32 with at least {n} entries, got {t.dtype} {tuple(t.shape)}.")
