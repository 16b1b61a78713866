"""Rotary position embedding (neox style), applied in place to q and k.

Design: one program per token. It loads its position's cos and sin (the cache row is
[cos | sin], rot_dim wide, as folio.layers.rotary_embedding builds it), then rotates every query
head and every key head of the token as [heads, rot_dim / 2] tiles: x1 = first half, x2 = second
half of the rotated channels; x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin; channels past rot_dim
(partial rotary) are untouched. q and k may be strided views of a fused qkv output; the rotation
is written back where they live, so no copy of q/k is made.

Rounding follows the torch path (each product and the sum rounded to the input dtype, as
transformers computes in the model dtype), so the GPU path reproduces the CPU path's values.
"""

import torch

from folio.kernels.triton_compat import check_dtype, check_same_device, next_power_of_2, tl, triton, use_triton_for

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rotate_heads(base_ptr, stride_h, cos, sin, NUM_HEADS, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)
    offs = tl.arange(0, HALF_PAD)
    mask = (heads[:, None] < NUM_HEADS) & (offs[None, :] < HALF)  # [heads, half]
    ptr1 = base_ptr + heads[:, None] * stride_h + offs[None, :]
    dtype = base_ptr.dtype.element_ty
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0).to(tl.float32)
    a = (x1 * cos[None, :]).to(dtype).to(tl.float32)
    b = (x2 * sin[None, :]).to(dtype).to(tl.float32)
    c = (x2 * cos[None, :]).to(dtype).to(tl.float32)
    d = (x1 * sin[None, :]).to(dtype).to(tl.float32)
    tl.store(ptr1, (a - b).to(dtype), mask=mask)
    tl.store(ptr1 + HALF, (c + d).to(dtype), mask=mask)


@triton.jit
def _cos_sin(cache_ptr, positions_ptr, token, cache_stride, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """The token's position's cos and sin rows [HALF_PAD] float32 (the cache row is [cos | sin])."""
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs = tl.arange(0, HALF_PAD)
    mask = offs < HALF
    cos = tl.load(cache_ptr + pos * cache_stride + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * cache_stride + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    q_ptr,  # [num_tokens, num_q_heads, head_dim], rotated in place
    k_ptr,  # [num_tokens, num_k_heads, head_dim], rotated in place
    positions_ptr,  # [num_tokens] int64
    cache_ptr,  # [max_position, rot_dim]: cos then sin
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    cache_stride,
    NUM_Q_HEADS,
    NUM_K_HEADS,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,  # rot_dim / 2
    HALF_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(cache_ptr, positions_ptr, token, cache_stride, HALF, HALF_PAD)
    _rotate_heads(q_ptr + token * q_stride_t, q_stride_h, cos, sin, NUM_Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr + token * k_stride_t, k_stride_h, cos, sin, NUM_K_HEADS, K_HEADS_PAD, HALF, HALF_PAD)


def apply_rotary(
    q: torch.Tensor,  # [num_tokens, num_heads * head_dim] or [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim] or [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_position, rot_dim]: cos then sin
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place (and return them). Triton on CUDA, else torch."""
    if use_triton_for(q):
        return rotary_triton(q, k, positions, cos_sin_cache, head_dim)
    return rotary_reference(q, k, positions, cos_sin_cache, head_dim)


def rotary_triton(q, k, positions, cos_sin_cache, head_dim):
    """Triton launcher: in place, no copies; positions must lie in [0, max_position)."""
    q3, k3 = _check(q, k, positions, cos_sin_cache, head_dim)
    check_same_device(_rotary_kernel, q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return q, k
    half = cos_sin_cache.shape[1] // 2
    _rotary_kernel[(num_tokens,)](
        q3,
        k3,
        positions,
        cos_sin_cache,
        q3.stride(0),
        q3.stride(1),
        k3.stride(0),
        k3.stride(1),
        cos_sin_cache.stride(0),
        q3.shape[1],
        k3.shape[1],
        Q_HEADS_PAD=next_power_of_2(q3.shape[1]),
        K_HEADS_PAD=next_power_of_2(k3.shape[1]),
        HALF=half,
        HALF_PAD=max(next_power_of_2(half), 2),
        num_warps=4,
        # Without this LLVM narrows each product to bf16 and contracts a product with the
        # following sub/add into one fma.rn.bf16, skipping the product's rounding: 1-ulp
        # differences from the torch path (seen on an H100). Memory-bound: no speed lost.
        enable_fp_fusion=False,
    )
    return q, k


def rotary_reference(q, k, positions, cos_sin_cache, head_dim):
    """Plain torch in the input dtype (transformers' rounding); writes into q and k."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [tokens, rot_dim / 2] each
    cos, sin = cos[:, None, :].to(q.dtype), sin[:, None, :].to(q.dtype)
    half = cos.shape[-1]
    for t in (q, k):
        x = t.view(t.shape[0], -1, head_dim)  # [tokens, heads, head_dim]
        x1, x2 = x[..., :half].clone(), x[..., half : 2 * half].clone()
        x[..., :half] = x1 * cos - x2 * sin
        x[..., half : 2 * half] = x2 * cos + x1 * sin
    return q, k


def _check(q, k, positions, cos_sin_cache, head_dim):
    check_dtype("q", q, _FLOATS)
    if k.dtype != q.dtype:
        raise ValueError(f"k dtype {k.dtype} != q dtype {q.dtype}.")
    check_dtype("cos_sin_cache", cos_sin_cache, _FLOATS)
    if positions.dim() != 1 or positions.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"positions must be 1-D int64/int32, got {tuple(positions.shape)} {positions.dtype}.")
    num_tokens = positions.shape[0]
    views = []
    for name, t in (("q", q), ("k", k)):
        if t.dim() not in (2, 3) or t.shape[0] != num_tokens or t.shape[-1] % head_dim:
            raise ValueError(f"{name} must be [{num_tokens}, heads * {head_dim}] or [{num_tokens}, heads, {head_dim}], got {tuple(t.shape)}.")
        try:
            t3 = t.view(num_tokens, -1, head_dim)  # [tokens, heads, head_dim]
        except RuntimeError as e:
            raise ValueError(f"{name} of shape {tuple(t.shape)} cannot be viewed as [tokens, heads, {head_dim}]: {e}") from e
        if t3.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim.")
        views.append(t3)
    rot_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rot_dim % 2 or rot_dim > head_dim or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache must be [max_position, rot_dim <= {head_dim}], rot_dim even, got {tuple(cos_sin_cache.shape)}.")
    return views[0], views[1]
