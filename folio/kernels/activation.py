"""SiLU-and-mul: the gated activation of Llama-family MLPs, [tokens, 2 * inter] -> [tokens, inter].

Design: programs over (token, column block of up to 1024); each reads the gate and up halves
once with 16-byte accesses and writes the product: 3 x tokens x inter x itemsize bytes in all,
against 5 for the unfused silu + mul. Rounding follows the torch path: silu rounded to the input
dtype, then the product rounded.
"""

import torch

from folio.kernels.fp8_gemm import FP8_DTYPE, MIN_SCALE, Fp8Activation, fp8_quantize, fp8_row_scale
from folio.kernels.triton_compat import (
    check_dtype,
    check_same_device,
    next_power_of_2,
    pdl_launch,
    pdl_wait,
    tl,
    triton,
    use_triton_for,
)

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,  # [num_tokens, inter] contiguous
    x_ptr,  # [num_tokens, 2 * inter]: gate then up
    x_stride_t,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (triton_compat.pdl_launch)
):
    pdl_wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    dtype = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + token * x_stride_t + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + token * x_stride_t + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + token * INTER + cols, (silu * up).to(dtype), mask=mask)


# The widest row the FP8-output kernel holds in registers at once (one program per token).
FP8_OUT_MAX_INTER = 16384


@triton.jit
def _silu_and_mul_fp8_kernel(
    q_ptr,  # [num_tokens, inter] float8e4nv, contiguous
    scale_ptr,  # [num_tokens] float32
    x_ptr,  # [num_tokens, 2 * inter]: gate then up
    x_stride_t,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,  # next power of two >= INTER: the whole row at once
    MIN_SCALE: tl.constexpr,
    PDL: tl.constexpr,
):
    """SiLU-and-mul quantized per token for an FP8 layer: the 16-bit product exactly as
    _silu_and_mul_kernel rounds it, then fp8_gemm's per-token quantization of that row, from
    registers: one kernel and one pass instead of two of each."""
    pdl_wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < INTER
    dtype = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + token * x_stride_t + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + token * x_stride_t + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    y = (silu * up).to(dtype).to(tl.float32)  # masked columns are 0: they leave the amax alone
    scale = fp8_row_scale(tl.max(tl.abs(y), 0), MIN_SCALE)
    tl.store(scale_ptr + token, scale)
    tl.store(q_ptr + token * INTER + cols, fp8_quantize(y, scale).to(q_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_fp8(x: torch.Tensor) -> Fp8Activation:
    """[tokens, 2 * inter] -> silu(gate) * up quantized per token (fp8_gemm.Fp8Activation): the
    same bits as quantize_per_token(silu_and_mul_triton(x)). inter <= FP8_OUT_MAX_INTER."""
    check_dtype("x", x, _FLOATS)
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [tokens, 2 * inter] and contiguous in its last dimension, got {tuple(x.shape)}.")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    if inter > FP8_OUT_MAX_INTER:
        raise ValueError(f"silu_and_mul_fp8: inter {inter} is over {FP8_OUT_MAX_INTER}.")
    check_same_device(_silu_and_mul_fp8_kernel, x=x)
    q = torch.empty(num_tokens, inter, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_tokens, 1, dtype=torch.float32, device=x.device)
    if num_tokens and inter:
        block = next_power_of_2(inter)
        _silu_and_mul_fp8_kernel[(num_tokens,)](q, scale, x, x.stride(0), INTER=inter, BLOCK=block, MIN_SCALE=MIN_SCALE,
                                                num_warps=min(max(block // 512, 4), 16), **pdl_launch(x))
    return Fp8Activation(q, scale, x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[tokens, 2 * inter] -> [tokens, inter]: silu(gate) * up. Triton on CUDA, else torch."""
    if use_triton_for(x):
        return silu_and_mul_triton(x)
    return silu_and_mul_reference(x)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:  # [tokens, 2 * inter] -> [tokens, inter]
    check_dtype("x", x, _FLOATS)
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [tokens, 2 * inter] and contiguous in its last dimension, got {tuple(x.shape)}.")
    check_same_device(_silu_and_mul_kernel, x=x)
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_tokens, inter, dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    block = min(next_power_of_2(inter), 1024)
    grid = (num_tokens, -(-inter // block))
    _silu_and_mul_kernel[grid](out, x, x.stride(0), INTER=inter, BLOCK=block, num_warps=4, **pdl_launch(x))
    return out


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:  # [tokens, 2 * inter] -> [tokens, inter]
    gate, up = x.chunk(2, dim=-1)  # [tokens, inter] each
    return torch.nn.functional.silu(gate) * up
