"""LoRA gate/up delta fused into SiLU-and-mul: out[t] = silu(g[t] + dg[t]) * (u[t] + du[t]).

A LoRA gate/up projection otherwise adds its delta into the [tokens, 2 * inter] output in place
(lora_expand: one read and one write of it) before SiLU-and-mul reads it once more. Here the
activation kernel computes the delta itself for the tiles it reads: per block of tokens of one
slot (the same grouping as the shrink), [BLOCK_M, R] of the shrink result times that slot's
[R, BLOCK_N] B tile for the gate columns and again for the up columns, on tensor cores. Tokens
without an adapter form one more group (slot == NUM_SLOTS) that takes the plain activation, so
every token is written exactly once; unused blocks (slot -1) return at once.

Rounding follows the unfused path exactly: the delta's dot as lora_expand computes it, gate and
up rounded to the activation dtype after the add (as the expand stores them), then silu rounded,
then the product rounded (as kernels/activation.py).
"""

from __future__ import annotations

import torch

from folio.kernels.activation import silu_and_mul_reference
from folio.kernels.lora_expand import ShrinkSource, lora_expand_reference, slot_delta
from folio.kernels.lora_shrink import LoRABlocks, block_m, block_tokens, check_mapping, num_blocks
from folio.kernels.triton_compat import check_same_device, next_power_of_2, tl, triton


@triton.jit
def _lora_silu_and_mul_kernel(
    out_ptr,  # [tokens, INTER]
    y_ptr,  # [tokens, 2 * INTER]: the base gate/up output, gate then up
    s_ptr,  # the shrink, gate's rank block then up's (lora_expand.ShrinkSource)
    b_ptr,  # [slots, 2 * INTER, R]
    sorted_ptr,  # [tokens] int32: tokens grouped by slot, no-adapter tokens last
    block_slots_ptr,  # [blocks] int32: a slot, NUM_SLOTS (no adapter) or -1 (unused)
    block_starts_ptr,
    block_ends_ptr,
    R,
    y_stride,
    s_stride,
    s_col0,
    s_slot_stride,
    b_stride_slot,
    b_stride_n,
    s_split_stride,
    SPLIT: tl.constexpr,  # split-K partials of the shrink, summed as they load
    INTER: tl.constexpr,
    NUM_SLOTS: tl.constexpr,
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
    tokens, mask_m = block_tokens(sorted_ptr, block_starts_ptr, block_ends_ptr, pid_b, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = cols < INTER
    mask = mask_m[:, None] & mask_n[None, :]
    dtype = y_ptr.dtype.element_ty
    rows = y_ptr + tokens[:, None] * y_stride + cols[None, :]
    gate = tl.load(rows, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_N]
    up = tl.load(rows + INTER, mask=mask, other=0.0).to(tl.float32)
    if slot < NUM_SLOTS:  # the gate shard's rank block, then the up shard's (B rows INTER on)
        s_col = s_col0 + slot * s_slot_stride
        d_gate = slot_delta(s_ptr, s_stride, s_col, b_ptr, slot, b_stride_slot, b_stride_n,
                            tokens, mask_m, cols, mask_n, R, s_split_stride, SPLIT, BLOCK_R, PRECISION)
        d_up = slot_delta(s_ptr, s_stride, s_col + R, b_ptr, slot, b_stride_slot, b_stride_n,
                          tokens, mask_m, cols + INTER, mask_n, R, s_split_stride, SPLIT, BLOCK_R, PRECISION)
        gate = (gate + d_gate).to(dtype).to(tl.float32)
        up = (up + d_up).to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + tokens[:, None] * INTER + cols[None, :], (silu * up).to(dtype), mask=mask)


def lora_silu_and_mul_triton(
    y: torch.Tensor,  # [tokens, 2 * inter] base gate/up output (rows may be strided)
    shrunk: torch.Tensor | ShrinkSource,  # [tokens, 2 * R] float32, its [split, ...] partials, or a source
    lora_b: torch.Tensor,  # [slots, 2 * inter, R]
    sorted_tokens: torch.Tensor,  # [tokens] int32: every token, adapter groups first
    act_blocks: LoRABlocks,  # plan_blocks over the slot groups plus the no-adapter group
) -> torch.Tensor:  # [tokens, inter]
    """Triton launcher (see the module docstring). With the stacked layout (lora/layers.py)
    y is the GEMM output's first 2 * inter columns and shrunk ShrinkSource.stacked of it."""
    source = shrunk if isinstance(shrunk, ShrinkSource) else ShrinkSource.of(shrunk)
    _check(y, source, lora_b)
    check_mapping(y.shape[0], lora_b.shape[0] + 1, sorted_tokens, act_blocks)  # + the no-adapter group
    check_same_device(_lora_silu_and_mul_kernel, y=y, shrunk=source.tensor, lora_b=lora_b, sorted_tokens=sorted_tokens)
    tokens, inter = y.shape[0], y.shape[1] // 2
    slots, _, r = lora_b.shape
    out = torch.empty((tokens, inter), dtype=y.dtype, device=y.device)
    if tokens == 0 or inter == 0:
        return out
    block_n = 64 if tokens <= 1024 else 128
    grid = (num_blocks(tokens, slots + 1), triton.cdiv(inter, block_n))
    s_stride, s_col0, s_slot_stride, split_stride, split = source.kernel_args()
    _lora_silu_and_mul_kernel[grid](
        out, y, source.tensor, lora_b, sorted_tokens, act_blocks.slots, act_blocks.starts, act_blocks.ends,
        r, y.stride(0), s_stride, s_col0, s_slot_stride, lora_b.stride(0), lora_b.stride(1),
        split_stride, SPLIT=split, INTER=inter, NUM_SLOTS=slots, BLOCK_M=block_m(tokens), BLOCK_N=block_n,
        BLOCK_R=max(16, next_power_of_2(r)), PRECISION="ieee" if lora_b.dtype == torch.float32 else "tf32",
        num_warps=4,
    )
    return out


def lora_silu_and_mul_reference(
    y: torch.Tensor,  # [tokens, 2 * inter]
    shrunk: torch.Tensor,  # [tokens, 2 * R] float32
    lora_b: torch.Tensor,  # [slots, 2 * inter, R]
    token_slots: torch.Tensor,  # [tokens] int, -1 = no adapter
) -> torch.Tensor:  # [tokens, inter]
    """The unfused path: the expand's in-place add (on a copy), then SiLU-and-mul."""
    inter = y.shape[1] // 2
    with_delta = lora_expand_reference(y.clone(), shrunk, lora_b, token_slots, [inter, inter])
    return silu_and_mul_reference(with_delta)


def _check(y: torch.Tensor, source: ShrinkSource, lora_b: torch.Tensor) -> None:
    if y.dim() != 2 or y.shape[1] % 2 or y.stride(1) != 1:
        raise ValueError(f"y must be [tokens, 2 * inter] with contiguous rows, got {tuple(y.shape)}.")
    if lora_b.dim() != 3 or lora_b.shape[1] != y.shape[1] or not lora_b.is_contiguous():
        raise ValueError(f"lora_b must be a contiguous [slots, {y.shape[1]}, R], got {tuple(lora_b.shape)}.")
    source.check(y.shape[0], lora_b.shape[0], 2 * lora_b.shape[2])
