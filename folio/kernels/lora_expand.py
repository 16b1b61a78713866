"""LoRA expand: y[t, shard cols] += s[t, shard ranks] @ B[slot[t]]^T, added in place.

The second half of the batched LoRA delta (folio/kernels/lora_shrink.py is the first): B lives
stacked in GPU slots as [slots, N, R] with the adapter's scaling folded in, and tokens arrive
grouped by slot exactly as for the shrink. A merged layer (QKV, gate/up) is one launch: shard j
owns output columns [offsets[j], offsets[j + 1]) and reads shrink columns [j * R, (j + 1) * R),
so each shard's B multiplies only its own A's result.

The shrink result is rounded to B's dtype before the dot, as PEFT's lora_B(lora_A(x)) rounds
between its two matmuls; the dot accumulates in float32 and y is rounded once after the add.
Grid: (the shrink's blocks, shards * n-blocks of the widest shard); each (token, col) pair
belongs to one program, so the read-modify-write of y needs no atomics.

Stacked layout (`lora_expand_stacked_triton`): when every slot's A sits under the base weight
as extra output rows (lora/layers.py), one GEMM gives [tokens, N + slots * shards * R]: the base
output, then each token's shrink under every slot, already rounded to the activation dtype (as
PEFT's lora_A(x) is). The same kernel then reads token t's shrink at column N + slot * shards
* R + shard * R and writes a separate, contiguous [tokens, N] output; tokens without an adapter
form one more group (slot == NUM_SLOTS) whose rows are copied. No shrink kernel runs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from folio.kernels.lora_shrink import LoRABlocks, block_m, block_tokens, check_mapping, num_blocks, sum_splits
from folio.kernels.triton_compat import check_dtype, check_same_device, next_power_of_2, tl, triton

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def slot_delta(s_ptr, s_stride, s_col, b_ptr, slot, b_stride_slot, b_stride_n, tokens, mask_m, cols, mask_n, R,
               s_split_stride, SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
    """[BLOCK_M, BLOCK_N] float32: the block's shrink columns [s_col, s_col + R) times the
    slot's B rows `cols`, transposed; the shrink (the sum of its SPLIT partials, in split
    order) rounded to B's dtype first. The expand and the fused gate/up activation
    (lora_silu_and_mul.py) both add this, so they round alike."""
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    s_ptrs = s_ptr + tokens[:, None] * s_stride + s_col + offs_r[None, :]
    s_mask = mask_m[:, None] & mask_r[None, :]
    s = tl.load(s_ptrs, mask=s_mask, other=0.0)
    for p in tl.static_range(1, SPLIT):
        s += tl.load(s_ptrs + p * s_split_stride, mask=s_mask, other=0.0)
    b_base = b_ptr + slot.to(tl.int64) * b_stride_slot
    b = tl.load(b_base + cols[:, None] * b_stride_n + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
    return tl.dot(s.to(b.dtype), tl.trans(b), input_precision=PRECISION)


@triton.jit
def _lora_expand_kernel(
    out_ptr,  # [tokens, N] (row stride out_stride): y itself (in place) or a new output
    y_ptr,  # [tokens, N] (row stride y_stride)
    s_ptr,  # the shrink: [split,] tokens rows (see ShrinkSource)
    b_ptr,  # [slots, N, R]
    offsets_ptr,  # [shards + 1] int32: output columns of each shard
    sorted_ptr,  # [tokens] int32
    block_slots_ptr,  # [blocks] int32 (see lora_shrink.plan_blocks): a slot, NUM_SLOTS (copy) or -1
    block_starts_ptr,  # [blocks] int32
    block_ends_ptr,  # [blocks] int32
    R,
    out_stride,
    y_stride,
    s_stride,
    s_col0,  # the shrink's first column
    s_slot_stride,  # columns between slots' shrinks (0: one shrink per token, its own slot's)
    b_stride_slot,
    b_stride_n,
    s_split_stride,
    SPLIT: tl.constexpr,  # split-K partials of the shrink, summed as they load
    NUM_SLOTS: tl.constexpr,
    NUM_N_BLOCKS: tl.constexpr,  # n-blocks of the widest shard
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot = tl.load(block_slots_ptr + pid_b)
    if slot < 0:
        return
    shard = pid_n // NUM_N_BLOCKS
    col_start = tl.load(offsets_ptr + shard) + (pid_n % NUM_N_BLOCKS) * BLOCK_N
    col_end = tl.load(offsets_ptr + shard + 1)
    if col_start >= col_end:
        return
    tokens, mask_m = block_tokens(sorted_ptr, block_starts_ptr, block_ends_ptr, pid_b, BLOCK_M)
    cols = col_start + tl.arange(0, BLOCK_N)
    mask_n = cols < col_end
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptr + tokens[:, None] * y_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if slot < NUM_SLOTS:
        s_col = s_col0 + slot * s_slot_stride + shard * R
        y += slot_delta(s_ptr, s_stride, s_col, b_ptr, slot, b_stride_slot, b_stride_n,
                        tokens, mask_m, cols, mask_n, R, s_split_stride, SPLIT, BLOCK_R, PRECISION)  # [BLOCK_M, BLOCK_N]
    tl.store(out_ptr + tokens[:, None] * out_stride + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


class ShrinkSource(NamedTuple):
    """Where the consumers of a shrink read token t's value for rank column c under slot s:
    tensor[(p,) t, col0 + s * slot_stride + c], summing split-K partials p in order."""

    tensor: torch.Tensor  # [tokens, W] / [split, tokens, W] float32, or the stacked GEMM's output
    col0: int
    slot_stride: int

    @staticmethod
    def of(shrunk: torch.Tensor) -> ShrinkSource:
        """A shrink kernel's result: one row per token, its own slot's value."""
        return ShrinkSource(shrunk, 0, 0)

    @staticmethod
    def stacked(y_ext: torch.Tensor, n: int, width: int) -> ShrinkSource:
        """The stacked GEMM's output [tokens, n + slots * width]: slot s's shrink at n + s * width."""
        return ShrinkSource(y_ext, n, width)

    def check(self, tokens: int, slots: int, width: int) -> None:
        """A consumer's check: `width` rank columns per token (shards * R), under every one of
        `slots` slots when stacked (the error names the tensor the caller passed)."""
        if self.slot_stride == 0:
            check_shrunk(self.tensor, tokens, width)
        elif (self.slot_stride != width or self.tensor.shape[0] != tokens
              or self.tensor.shape[1] != self.col0 + slots * width or self.tensor.stride(1) != 1):
            raise ValueError(f"y_ext (a stacked shrink) must be [{tokens}, {self.col0} + {slots} * {width}], "
                             f"got {tuple(self.tensor.shape)} with slot stride {self.slot_stride}.")

    def kernel_args(self) -> tuple[int, int, int, int, int]:
        """(row stride, col0, slot stride, split stride, splits) as the kernels take them."""
        split_stride, split = split_layout(self.tensor)
        return self.tensor.stride(-2), self.col0, self.slot_stride, split_stride, split


def lora_expand_triton(
    y: torch.Tensor,  # [tokens, N], updated in place
    shrunk: torch.Tensor,  # [tokens, shards * R] float32, or its [split, tokens, shards * R] partials
    lora_b: torch.Tensor,  # [slots, N, R]
    shard_offsets: torch.Tensor,  # [shards + 1] int32 on y's device: 0, ..., N
    sorted_tokens: torch.Tensor,  # [tokens] int32
    blocks: LoRABlocks,  # the shrink's blocks
    shard_sizes: list[int],  # the same shards, on the host (tile sizes depend on them)
) -> torch.Tensor:
    """Triton launcher: adds each token's adapter delta into y; returns y."""
    _check(y, lora_b, shard_offsets, shard_sizes)
    ShrinkSource.of(shrunk).check(y.shape[0], lora_b.shape[0], len(shard_sizes) * lora_b.shape[2])
    check_mapping(y.shape[0], lora_b.shape[0], sorted_tokens, blocks)
    check_same_device(_lora_expand_kernel, y=y, shrunk=shrunk, lora_b=lora_b, shard_offsets=shard_offsets)
    _launch(y, y, ShrinkSource.of(shrunk), lora_b, shard_offsets, sorted_tokens, blocks, shard_sizes, lora_b.shape[0])
    return y


def lora_expand_stacked_triton(
    y_ext: torch.Tensor,  # [tokens, N + slots * shards * R]: the stacked GEMM's output
    lora_b: torch.Tensor,  # [slots, N, R]
    shard_offsets: torch.Tensor,  # [shards + 1] int32: 0, ..., N
    sorted_tokens: torch.Tensor,  # [tokens] int32: every token, adapter groups first
    act_blocks: LoRABlocks,  # plan_blocks over the slot groups plus the no-adapter group
    shard_sizes: list[int],
) -> torch.Tensor:  # [tokens, N] contiguous: the base output plus each token's delta
    """Triton launcher of the stacked layout (see the module docstring)."""
    slots, n, r = lora_b.shape
    width = len(shard_sizes) * r
    source = ShrinkSource.stacked(y_ext, n, width)
    _check(y_ext[:, :n], lora_b, shard_offsets, shard_sizes)
    source.check(y_ext.shape[0], slots, width)
    check_mapping(y_ext.shape[0], slots + 1, sorted_tokens, act_blocks)  # + the no-adapter group
    check_same_device(_lora_expand_kernel, y_ext=y_ext, lora_b=lora_b, shard_offsets=shard_offsets)
    out = torch.empty((y_ext.shape[0], n), dtype=y_ext.dtype, device=y_ext.device)
    _launch(out, y_ext, source, lora_b, shard_offsets, sorted_tokens, act_blocks, shard_sizes, slots + 1)
    return out


def _launch(out, y, source: ShrinkSource, lora_b, shard_offsets, sorted_tokens, blocks, shard_sizes, groups) -> None:
    tokens = y.shape[0]
    slots, _, r = lora_b.shape
    if tokens == 0:
        return
    block_n = 64 if tokens <= 1024 else 128
    n_blocks = triton.cdiv(max(shard_sizes), block_n)
    s_stride, s_col0, s_slot_stride, split_stride, split = source.kernel_args()
    grid = (num_blocks(tokens, groups), len(shard_sizes) * n_blocks)
    _lora_expand_kernel[grid](
        out, y, source.tensor, lora_b, shard_offsets, sorted_tokens, blocks.slots, blocks.starts, blocks.ends,
        r, out.stride(0), y.stride(0), s_stride, s_col0, s_slot_stride, lora_b.stride(0), lora_b.stride(1),
        split_stride,
        SPLIT=split,
        NUM_SLOTS=slots,
        NUM_N_BLOCKS=n_blocks,
        BLOCK_M=block_m(tokens),
        BLOCK_N=block_n,
        BLOCK_R=max(16, next_power_of_2(r)),
        PRECISION="ieee" if lora_b.dtype == torch.float32 else "tf32",
        num_warps=4,
    )


def lora_expand_reference(
    y: torch.Tensor,  # [tokens, N], updated in place
    shrunk: torch.Tensor,  # [tokens, shards * R] float32, or its [split, ...] partials
    lora_b: torch.Tensor,  # [slots, N, R]
    token_slots: torch.Tensor,  # [tokens] int, -1 = no adapter
    shard_sizes: list[int],
) -> torch.Tensor:
    """Plain torch with the kernel's rounding: shrink rounded to B's dtype, float32 dot and add."""
    r = lora_b.shape[2]
    rounded = sum_splits(shrunk).to(lora_b.dtype).float()  # [tokens, shards * R]
    delta = torch.zeros(y.shape, dtype=torch.float32, device=y.device)  # [tokens, N]
    for slot in range(lora_b.shape[0]):  # masked, no host reads: graph-safe (see the shrink)
        mask = (token_slots == slot).unsqueeze(1)  # [tokens, 1]
        col = 0
        for j, size in enumerate(shard_sizes):
            part = rounded[:, j * r : (j + 1) * r] @ lora_b[slot, col : col + size].float().T  # [tokens, size]
            delta[:, col : col + size] = torch.where(mask, part, delta[:, col : col + size])
            col += size
    has_adapter = (token_slots >= 0).unsqueeze(1)  # [tokens, 1]
    y.copy_(torch.where(has_adapter, (y.float() + delta).to(y.dtype), y))
    return y


def lora_expand_stacked_reference(
    y_ext: torch.Tensor,  # [tokens, N + slots * shards * R]: the stacked GEMM's output
    lora_b: torch.Tensor,  # [slots, N, R]
    token_slots: torch.Tensor,  # [tokens] int, -1 = no adapter
    shard_sizes: list[int],
) -> torch.Tensor:  # [tokens, N] contiguous
    """Plain torch: each token's own slot's shrink gathered from the stacked columns (on the
    device, no host reads), then the expand reference on a copy of the base columns."""
    slots, n, _ = lora_b.shape
    stacked = stacked_shrink(y_ext, n, slots)  # [tokens, slots, width]
    rows = torch.arange(y_ext.shape[0], device=y_ext.device)
    shrunk = stacked[rows, token_slots.clamp(min=0).long()].float()  # [tokens, width]
    return lora_expand_reference(y_ext[:, :n].clone(), shrunk, lora_b, token_slots, shard_sizes)


def stacked_shrink(y_ext: torch.Tensor, n: int, slots: int) -> torch.Tensor:
    """[tokens, slots, width] view of the stacked GEMM output's shrink columns."""
    return y_ext[:, n:].unflatten(1, (slots, -1))


def _check(y, lora_b, shard_offsets, shard_sizes) -> None:
    check_dtype("y", y, _FLOATS)
    check_dtype("lora_b", lora_b, _FLOATS)
    if y.dim() != 2 or y.stride(1) != 1:
        raise ValueError(f"y must be [tokens, N] with contiguous rows, got {tuple(y.shape)}.")
    n = y.shape[1]
    if sum(shard_sizes) != n or not shard_sizes:
        raise ValueError(f"shard sizes {shard_sizes} must add up to y's {n} columns.")
    if lora_b.dim() != 3 or lora_b.shape[1] != n or not lora_b.is_contiguous():
        raise ValueError(f"lora_b must be a contiguous [slots, {n}, R], got {tuple(lora_b.shape)}.")
    if lora_b.shape[2] > 128:
        raise ValueError(f"rank up to 128 is supported, got {lora_b.shape[2]}.")
    if shard_offsets.dtype != torch.int32 or tuple(shard_offsets.shape) != (len(shard_sizes) + 1,):
        raise ValueError(f"shard_offsets must be int32 [{len(shard_sizes) + 1}], got {shard_offsets.dtype} {tuple(shard_offsets.shape)}.")


def split_layout(shrunk: torch.Tensor) -> tuple[int, int]:
    """(stride between split-K partials, how many) of a shrink result: (0, 1) when summed."""
    return (shrunk.stride(0), shrunk.shape[0]) if shrunk.dim() == 3 else (0, 1)


def check_shrunk(shrunk: torch.Tensor, tokens: int, width: int) -> None:
    """A shrink result as the expand and the fused activation take it: float32 [tokens, >= width],
    or [split, tokens, >= width] partials (lora_shrink_triton's keep_splits), last dim contiguous."""
    if shrunk.dtype != torch.float32 or shrunk.dim() not in (2, 3) or shrunk.shape[-2] != tokens or shrunk.shape[-1] < width:
        raise ValueError(f"shrunk must be float32 ([split,] {tokens}, {width}), got {shrunk.dtype} {tuple(shrunk.shape)}.")
    if shrunk.stride(-1) != 1:
        raise ValueError("shrunk must be contiguous in its last dimension.")
