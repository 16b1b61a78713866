"""SiLU-and-mul: the gated activation of Llama-family MLPs, [tokens, 2 * inter] -> [tokens, inter].

Design: programs over (token, column block of up to 1024); each reads the gate and up halves
once with 16-byte accesses and writes the product: 3 x tokens x inter x itemsize bytes in all,
against 5 for the unfused silu + mul. Rounding follows the torch path: silu rounded to the input
dtype, then the product rounded.
"""

import torch

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
