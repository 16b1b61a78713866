"""LoRA shrink: s[t] = x[t] @ A[slot[t]]^T for a batch whose tokens use different adapters.

The Punica / S-LoRA idea: adapters live stacked in GPU slots, A as [slots, R, K], and each token
carries the slot of its adapter (-1: none). The host groups the step's token indices by slot
(`sorted_tokens`, with each slot's `slot_starts` / `slot_counts`), so a program owns BLOCK_M
tokens of ONE slot and multiplies them by that slot's A with tensor-core dots: a segmented
GEMM, no per-token matrix-vector products. Tokens without an adapter are in no group and cost
nothing.

Grid: (cdiv(tokens, BLOCK_M), slots, SPLIT_K). It depends only on the padded token count, so a
CUDA graph captured for a decode batch size is valid for every mix of adapters; programs past
their slot's count return at once. Decode batches have few tokens per slot and a long K, so
the K loop is split over SPLIT_K programs writing partial sums, added afterwards (no atomics:
the result does not depend on the order programs finish in).

For merged layers (QKV, gate/up) R stacks each shard's rank block: R = shards * r_max.
"""

from __future__ import annotations

import torch

from folio.kernels.triton_compat import check_dtype, check_same_device, next_power_of_2, tl, triton

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def slot_tokens(sorted_ptr, starts_ptr, slot, pid_m, count, BLOCK_M: tl.constexpr):
    """The token indices of this program's block of one slot's group, and which are real."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < count
    start = tl.load(starts_ptr + slot)
    tokens = tl.load(sorted_ptr + start + offs_m, mask=mask_m, other=0).to(tl.int64)
    return tokens, mask_m


@triton.jit
def _lora_shrink_kernel(
    out_ptr,  # [SPLIT_K, tokens, R] float32
    x_ptr,  # [tokens, K]
    a_ptr,  # [slots, R, K]
    sorted_ptr,  # [tokens] int32: token indices grouped by slot
    starts_ptr,  # [slots] int32
    counts_ptr,  # [slots] int32
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
    pid_m = tl.program_id(0)
    slot = tl.program_id(1)
    pid_k = tl.program_id(2)
    count = tl.load(counts_ptr + slot)
    if pid_m * BLOCK_M >= count:
        return
    tokens, mask_m = slot_tokens(sorted_ptr, starts_ptr, slot, pid_m, count, BLOCK_M)
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
    slot_starts: torch.Tensor,  # [slots] int32
    slot_counts: torch.Tensor,  # [slots] int32
    split_k: int | None = None,
) -> torch.Tensor:  # [tokens, R] float32; rows of tokens without an adapter are undefined
    """Triton launcher: checks shapes, picks tile sizes, sums the split-K partials."""
    _check(x, lora_a, sorted_tokens, slot_starts, slot_counts)
    check_same_device(_lora_shrink_kernel, x=x, lora_a=lora_a, sorted_tokens=sorted_tokens)
    tokens, k = x.shape
    slots, r, _ = lora_a.shape
    split = split_k or _default_split(tokens, k)
    partial = torch.empty((split, tokens, r), dtype=torch.float32, device=x.device)
    if tokens == 0:
        return partial.sum(0)
    block_m = 16 if tokens <= 1024 else 64
    grid = (triton.cdiv(tokens, block_m), slots, split)
    _lora_shrink_kernel[grid](
        partial,
        x,
        lora_a,
        sorted_tokens,
        slot_starts,
        slot_counts,
        tokens,
        k,
        r,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        BLOCK_M=block_m,
        BLOCK_R=max(16, next_power_of_2(r)),
        BLOCK_K=64,
        SPLIT_K=split,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=4,
    )
    return partial[0] if split == 1 else partial.sum(0)


def lora_shrink_reference(
    x: torch.Tensor,  # [tokens, K]
    lora_a: torch.Tensor,  # [slots, R, K]
    token_slots: torch.Tensor,  # [tokens] int, -1 = no adapter
) -> torch.Tensor:  # [tokens, R] float32, zero for tokens without an adapter
    """Plain torch, one matmul per slot present (the CPU path; it reads slots on the host)."""
    out = torch.zeros((x.shape[0], lora_a.shape[1]), dtype=torch.float32, device=x.device)
    for slot in token_slots.unique().tolist():
        if slot < 0:
            continue
        rows = (token_slots == slot).nonzero().squeeze(1)  # [n]
        out[rows] = x[rows].float() @ lora_a[slot].float().T  # [n, R]
    return out


def _default_split(tokens: int, k: int) -> int:
    """Few tokens per slot (decode): split the K loop so more programs share the reads of A."""
    if tokens > 512:
        return 1
    return max(1, min(8, k // 512))


def _check(x, lora_a, sorted_tokens, slot_starts, slot_counts) -> None:
    check_dtype("x", x, _FLOATS)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [tokens, K] with contiguous rows, got {tuple(x.shape)}.")
    if lora_a.dim() != 3 or lora_a.shape[2] != x.shape[1] or not lora_a.is_contiguous():
        raise ValueError(f"lora_a must be a contiguous [slots, R, {x.shape[1]}], got {tuple(lora_a.shape)}.")
    if lora_a.dtype != x.dtype:
        raise ValueError(f"lora_a must have x's dtype {x.dtype}, got {lora_a.dtype}.")
    if lora_a.shape[1] > 256:
        raise ValueError(f"at most 256 stacked rank rows are supported, got {lora_a.shape[1]}.")
    _check_mapping(x.shape[0], lora_a.shape[0], sorted_tokens, slot_starts, slot_counts)


def _check_mapping(tokens: int, slots: int, sorted_tokens, slot_starts, slot_counts) -> None:
    for name, t, n in (("sorted_tokens", sorted_tokens, tokens), ("slot_starts", slot_starts, slots), ("slot_counts", slot_counts, slots)):
        if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] < n:
            raise ValueError(f"{name} must be int32 with at least {n} entries, got {t.dtype} {tuple(t.shape)}.")
