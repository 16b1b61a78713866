"""Qwen3's per-head RMSNorm of q and k, then rotary (and the K/V store), in one launch, in place.

Qwen3-style attention normalizes every query and key head (q_norm, k_norm: RMSNorm over
head_dim) before the rotary embedding. Run as three kernels that is three launches per layer for
a few kilobytes of work each; at batch-1 decode, where a step is a chain of small kernels, the
launches are the cost. Here one program per token normalizes its q heads and k heads in place
(q and k may be strided views of the fused qkv output), waits for its own stores (a barrier),
then rotates them with the rotary kernel's own routine.

With `cache` the same program then stores the rotated K and V at their slots, as
reshape_and_cache would (one launch fewer again); with NORM off it is rotary + store for models
without head norms (Llama, Qwen2, Mistral).

Rounding takes the separate kernels' steps: kernels/rms_norm.py's normalize, round, scale, round;
then kernels/rotary.py's rounded products. The one difference: the float32 sum of squares runs
over a [heads, head_dim] tile here and over a row in rms_norm.py, so on a GPU its order differs
and a rare head row can come out one bf16 step apart from the separate kernels' (the interpreter
adds in one order: there the two agree bit for bit). The rotation and the K/V store are the same
code as the separate kernels'.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from folio.kernels.reshape_and_cache import FP8_KV_DTYPE, store_token_kv
from folio.kernels.reshape_and_cache import _check as _check_kv
from folio.kernels.rotary import _check as _check_rotary
from folio.kernels.rotary import _cos_sin, _rotate_heads, rotary_reference
from folio.kernels.rms_norm import rms_norm_reference
from folio.kernels.triton_compat import (
    check_same_device,
    next_power_of_2,
    pdl_launch,
    pdl_wait,
    tl,
    triton,
)


@triton.jit
def _norm_heads(base_ptr, stride_h, w, eps, NUM_HEADS, HEADS_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)
    cols = tl.arange(0, D_PAD)
    mask = (heads[:, None] < NUM_HEADS) & (cols[None, :] < D)  # [heads, head_dim]
    ptr = base_ptr + heads[:, None] * stride_h + cols[None, :]
    dtype = base_ptr.dtype.element_ty
    x = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    variance = tl.sum(x * x, 1) / D  # [heads]
    rstd = tl.div_rn(1.0, tl.sqrt_rn(variance + eps))
    normed = (x * rstd[:, None]).to(dtype).to(tl.float32)
    tl.store(ptr, (normed * w[None, :]).to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,  # [num_tokens, num_q_heads, head_dim], normalized and rotated in place
    k_ptr,  # [num_tokens, num_k_heads, head_dim], normalized and rotated in place
    positions_ptr,  # [num_tokens] int64
    cache_ptr,  # [max_position, rot_dim]: cos then sin
    q_weight_ptr,  # [head_dim]
    k_weight_ptr,  # [head_dim]
    q_eps,
    k_eps,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    cache_stride,
    NUM_Q_HEADS,
    NUM_K_HEADS,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    HALF: tl.constexpr,  # rot_dim / 2
    HALF_PAD: tl.constexpr,
    # WRITE_KV: then store this token's rotated K and its V in the paged cache (reshape_and_cache)
    v_ptr,  # [num_tokens, num_k_heads, head_dim]
    v_stride_t,
    v_stride_h,
    k_cache_ptr,  # [num_blocks, block_size, num_k_heads, head_dim]
    v_cache_ptr,
    slot_mapping_ptr,  # [num_tokens] int64, -1 = nothing to store
    inv_k_scale,
    inv_v_scale,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    BLOCK_SIZE: tl.constexpr,
    IS_FP8: tl.constexpr,
    WRITE_KV: tl.constexpr,
    NORM: tl.constexpr,  # False: rotary (+ the K/V store) only, for models without head norms
    PDL: tl.constexpr,  # programmatic dependent launch: only the norm weights are read before gdc_wait
):
    token = tl.program_id(0).to(tl.int64)
    q_base = q_ptr + token * q_stride_t
    k_base = k_ptr + token * k_stride_t
    if NORM:
        cols = tl.arange(0, D_PAD)
        q_w = tl.load(q_weight_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        k_w = tl.load(k_weight_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    if NORM:
        _norm_heads(q_base, q_stride_h, q_w, q_eps, NUM_Q_HEADS, Q_HEADS_PAD, D, D_PAD)
        _norm_heads(k_base, k_stride_h, k_w, k_eps, NUM_K_HEADS, K_HEADS_PAD, D, D_PAD)
        tl.debug_barrier()  # the rotation reads back what other threads of this program stored
    cos, sin = _cos_sin(cache_ptr, positions_ptr, token, cache_stride, HALF, HALF_PAD)
    _rotate_heads(q_base, q_stride_h, cos, sin, NUM_Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_base, k_stride_h, cos, sin, NUM_K_HEADS, K_HEADS_PAD, HALF, HALF_PAD)
    if WRITE_KV:
        tl.debug_barrier()  # the rotated K, stored by other threads of this program
        store_token_kv(
            k_base, k_stride_h, v_ptr + token * v_stride_t, v_stride_h, k_cache_ptr, v_cache_ptr,
            slot_mapping_ptr + token, inv_k_scale, inv_v_scale, cache_stride_block, cache_stride_slot,
            cache_stride_head, NUM_K_HEADS, D, BLOCK_SIZE, K_HEADS_PAD, D_PAD, IS_FP8,
        )


def qk_norm_rope_triton(
    q: torch.Tensor,  # [num_tokens, num_heads * head_dim] (a view of qkv is fine)
    k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_position, rot_dim]
    head_dim: int,
    q_weight: torch.Tensor | None,  # [head_dim]; None (and k_weight None): no head norms
    k_weight: torch.Tensor | None,  # [head_dim]
    q_eps: float = 1e-6,
    k_eps: float = 1e-6,
    cache: KVWrite | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher: normalizes each head of q and k (with weights), then rotates them, in
    place; with `cache`, also stores the rotated K and V at their slots (the attention then
    does not)."""
    q3, k3 = _check_rotary(q, k, positions, cos_sin_cache, head_dim)
    norm = q_weight is not None and k_weight is not None
    if norm and (q_weight.shape != (head_dim,) or k_weight.shape != (head_dim,)):
        raise ValueError(f"q/k norm weights must be [{head_dim}], got {tuple(q_weight.shape)} / {tuple(k_weight.shape)}.")
    weights = dict(q_weight=q_weight, k_weight=k_weight) if norm else {}
    check_same_device(_qk_norm_rope_kernel, q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache, **weights)
    if not norm:
        q_weight = k_weight = cos_sin_cache  # placeholders: NORM is off
    num_tokens = q3.shape[0]
    if num_tokens == 0:
        return q, k
    half = cos_sin_cache.shape[1] // 2
    kv = _kv_args(cache, k3, num_tokens)
    _qk_norm_rope_kernel[(num_tokens,)](
        q3, k3, positions, cos_sin_cache, q_weight, k_weight, q_eps, k_eps,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), cos_sin_cache.stride(0),
        q3.shape[1], k3.shape[1],
        Q_HEADS_PAD=next_power_of_2(q3.shape[1]),
        K_HEADS_PAD=next_power_of_2(k3.shape[1]),
        D=head_dim,
        D_PAD=next_power_of_2(head_dim),
        HALF=half,
        HALF_PAD=max(next_power_of_2(half), 2),
        **kv,
        NORM=norm,
        num_warps=4,
        **pdl_launch(q3),
        enable_fp_fusion=False,  # as the rotary kernel: each product rounded (see rotary.py)
    )
    return q, k


class KVWrite(NamedTuple):
    """Where the fused kernel stores K and V: as reshape_and_cache takes them."""

    value: torch.Tensor  # [num_tokens, num_kv_heads * head_dim] (a view of qkv is fine)
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    k_scale: float = 1.0
    v_scale: float = 1.0


def _kv_args(cache: KVWrite | None, k3: torch.Tensor, num_tokens: int) -> dict:
    if cache is None:  # WRITE_KV off: the pointer arguments are placeholders
        return dict(v_ptr=k3, v_stride_t=0, v_stride_h=0, k_cache_ptr=k3, v_cache_ptr=k3, slot_mapping_ptr=k3,
                    inv_k_scale=1.0, inv_v_scale=1.0, cache_stride_block=0, cache_stride_slot=0,
                    cache_stride_head=0, BLOCK_SIZE=1, IS_FP8=False, WRITE_KV=False)
    v3 = cache.value.view(num_tokens, k3.shape[1], k3.shape[2])
    _check_kv(k3, v3, cache.kv_cache, cache.slot_mapping)
    if cache.slot_mapping.shape[0] != num_tokens:  # one program per token reads its slot
        raise ValueError(f"slot_mapping must have one entry per token ({num_tokens}), got {cache.slot_mapping.shape[0]}.")
    k_cache, v_cache = cache.kv_cache[0], cache.kv_cache[1]  # [num_blocks, block_size, kv_heads, dim] each
    return dict(v_ptr=v3, v_stride_t=v3.stride(0), v_stride_h=v3.stride(1), k_cache_ptr=k_cache, v_cache_ptr=v_cache,
                slot_mapping_ptr=cache.slot_mapping, inv_k_scale=1.0 / cache.k_scale, inv_v_scale=1.0 / cache.v_scale,
                cache_stride_block=k_cache.stride(0), cache_stride_slot=k_cache.stride(1),
                cache_stride_head=k_cache.stride(2), BLOCK_SIZE=k_cache.shape[1],
                IS_FP8=cache.kv_cache.dtype == FP8_KV_DTYPE, WRITE_KV=True)


def qk_norm_rope_reference(q, k, positions, cos_sin_cache, head_dim, q_weight, k_weight, q_eps, k_eps):
    """The separate torch steps: per-head RMSNorm of q and of k, then rotary (new tensors)."""
    tokens = q.shape[0]
    qn = rms_norm_reference(q.reshape(tokens, -1, head_dim), q_weight, q_eps).reshape(q.shape)
    kn = rms_norm_reference(k.reshape(tokens, -1, head_dim), k_weight, k_eps).reshape(k.shape)
    return rotary_reference(qn, kn, positions, cos_sin_cache, head_dim)
