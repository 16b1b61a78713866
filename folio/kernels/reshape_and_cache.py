"""reshape_and_cache: store each new token's K and V at its slot of the paged KV cache.

Design: one program per token slot, each moving that token's [num_kv_heads, head_dim] tile of K
and of V (2 x 2 KiB for Qwen3-0.6B in bf16) with 16-byte accesses. Slot -1 is padding and writes
nothing, so the grid (one program per entry of slot_mapping) depends only on the padded token
count and stays valid under CUDA graph capture. K/V may be strided views of a fused qkv output:
token and head strides are passed, only the last dimension must be contiguous.

An FP8 cache (float8_e4m3fn) stores K / k_scale and V / v_scale, rounded to nearest and
saturated at +-448; readers multiply back (folded into the softmax scale and the output).
"""

import torch

from folio.kernels.triton_compat import check_dtype, check_same_device, next_power_of_2, tl, triton

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_kv_reference(x: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
    """x as the cache stores it: / scale, saturated and rounded for FP8; a plain cast otherwise."""
    if cache_dtype != FP8_KV_DTYPE:
        return x.to(cache_dtype)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)


def dequantize_kv_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The values an FP8 cache stands for (float32); other caches are returned as they are."""
    return x.float() * scale if x.dtype == FP8_KV_DTYPE else x


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int64
    inv_k_scale,  # 1 / k_scale (FP8 cache only)
    inv_v_scale,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    store_token_kv(
        key_ptr + token * key_stride_t, key_stride_h, value_ptr + token * value_stride_t, value_stride_h,
        k_cache_ptr, v_cache_ptr, slot_mapping_ptr + token, inv_k_scale, inv_v_scale,
        cache_stride_block, cache_stride_slot, cache_stride_head,
        NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, HEADS_PAD, DIM_PAD, IS_FP8,
    )


@triton.jit
def store_token_kv(
    key_base, key_stride_h, value_base, value_stride_h,  # this token's [heads, dim] K and V
    k_cache_ptr, v_cache_ptr, slot_ptr, inv_k_scale, inv_v_scale,
    cache_stride_block, cache_stride_slot, cache_stride_head,
    NUM_KV_HEADS, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr, IS_FP8: tl.constexpr,
):
    """One token's K and V into its slot (nothing for slot -1): this kernel's body, and the
    tail of kernels that produce K in a program per token (qk_norm_rope.py). NUM_KV_HEADS may
    be a runtime value (it only masks the HEADS_PAD rows)."""
    slot = tl.load(slot_ptr).to(tl.int64)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        heads = tl.arange(0, HEADS_PAD)
        dims = tl.arange(0, DIM_PAD)
        mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)  # [heads, dim]
        k = tl.load(key_base + heads[:, None] * key_stride_h + dims[None, :], mask=mask)
        v = tl.load(value_base + heads[:, None] * value_stride_h + dims[None, :], mask=mask)
        if IS_FP8:
            k = tl.clamp(k.to(tl.float32) * inv_k_scale, -448.0, 448.0)
            v = tl.clamp(v.to(tl.float32) * inv_v_scale, -448.0, 448.0)
        dst = block * cache_stride_block + offset * cache_stride_slot + heads[:, None] * cache_stride_head + dims[None, :]
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [n <= num_tokens] int64, -1 = skip
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Triton launcher: kv_cache[:, slot // block_size, slot % block_size] = key, value
    (divided by k_scale / v_scale when the cache is FP8)."""
    _check(key, value, kv_cache, slot_mapping)
    check_same_device(_reshape_and_cache_kernel, key=key, value=value, kv_cache=kv_cache, slot_mapping=slot_mapping)
    num_slots = slot_mapping.shape[0]
    if num_slots == 0:
        return
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, kv_heads, dim] each
    _reshape_and_cache_kernel[(num_slots,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        1.0 / k_scale,
        1.0 / v_scale,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        HEADS_PAD=next_power_of_2(num_kv_heads),
        DIM_PAD=next_power_of_2(head_dim),
        IS_FP8=kv_cache.dtype == FP8_KV_DTYPE,
        num_warps=4,
    )


def reshape_and_cache_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [n <= num_tokens] int64, -1 = skip
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Plain torch: the same stores by index_put on the flattened slots."""
    n = slot_mapping.shape[0]
    keep = slot_mapping >= 0  # [n]
    slots = slot_mapping[keep]  # [kept]
    heads, dim = kv_cache.shape[-2], kv_cache.shape[-1]
    kv_cache[0].view(-1, heads, dim)[slots] = quantize_kv_reference(key[:n][keep], k_scale, kv_cache.dtype)
    kv_cache[1].view(-1, heads, dim)[slots] = quantize_kv_reference(value[:n][keep], v_scale, kv_cache.dtype)


def _check(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim], got {tuple(kv_cache.shape)}.")
    heads, dim = kv_cache.shape[3], kv_cache.shape[4]
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or t.shape[1:] != (heads, dim):
            raise ValueError(f"{name} must be [num_tokens, {heads}, {dim}] to match kv_cache, got {tuple(t.shape)}.")
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension.")
        check_dtype(name, t, _FLOATS)
    check_dtype("kv_cache", kv_cache, (*_FLOATS, FP8_KV_DTYPE))
    if kv_cache.stride(4) != 1:
        raise ValueError("kv_cache must be contiguous in its last dimension.")
    if slot_mapping.dim() != 1 or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be 1-D int64, got {tuple(slot_mapping.shape)} {slot_mapping.dtype}.")
    if slot_mapping.shape[0] > min(key.shape[0], value.shape[0]):
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} entries but key/value hold {key.shape[0]}/{value.shape[0]} tokens."
        )
