"""FP8 (e4m3) W8A8 matmul: per-token or per-tensor activation scales times per-channel weights.

y = (x_q * x_scale) @ (w_q * w_scale)^T + b, accumulated in float32. On CUDA the product runs
on the FP8 tensor cores: up to TRITON_MAX_M tokens in folio's Triton kernel
(folio/kernels/fp8_gemm_triton.py), above that through cuBLASLt (torch._scaled_mm), both with
the scales applied in the epilogue; elsewhere (and for shapes cuBLASLt refuses) the reference
dequantizes and multiplies in float32. Activations are quantized the same way on both paths, so the CPU path reproduces
the GPU's rounding up to the order of float32 accumulation.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from folio.kernels.fp8_gemm_triton import TRITON_MAX_M, USE_TRITON_GEMM, fp8_gemm_triton
from folio.kernels.triton_compat import (
    check_same_device,
    next_power_of_2,
    pdl_launch,
    pdl_wait,
    tl,
    triton,
    use_triton_for,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0
# cuBLASLt accumulates FP8 products in the tensor cores' own (reduced-precision) accumulator, as
# Triton does on Hopper by default and vLLM's CUTLASS kernels do; FOLIO_FP8_FAST_ACCUM=0 asks
# cuBLASLt (above TRITON_MAX_M tokens) to promote to float32 every few steps (slower at large M).
# The Triton kernel's split-K keeps its accumulations short instead. The GPU tests bound the error.
FAST_ACCUM = os.environ.get("FOLIO_FP8_FAST_ACCUM", "1") != "0"
# The kernel before an FP8 linear layer (RMSNorm, SiLU-and-mul) quantizes its output for it, in
# the same kernel; FOLIO_FP8_FUSED_QUANT=0 leaves the quantization to the layer (the A/B switch).
FUSED_FP8_QUANT = os.environ.get("FOLIO_FP8_FUSED_QUANT", "1") != "0"
_NO_FAST_ACCUM: set[tuple] = set()  # (M, N, K, out dtype, device) cuBLASLt had no fast kernel for
# Smallest scale a row may get: an all-zero row must not divide by zero (vLLM uses the same).
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


class Fp8Activation(NamedTuple):
    """Activations already quantized per token by the kernel that produced them (the fused
    RMSNorm): what an FP8 linear layer would otherwise make with quantize_per_token."""

    q: torch.Tensor  # [..., K] float8_e4m3fn, contiguous
    scale: torch.Tensor  # [..., 1] float32
    dtype: torch.dtype  # what the rows were before quantization: the layer's output dtype


@triton.jit
def fp8_row_scale(amax, MIN_SCALE: tl.constexpr):
    """A row's scale from its amax: amax / 448 by IEEE division (div_rn, as torch divides; the
    GPU's default `/` is approximate), at least MIN_SCALE. Every kernel that quantizes per token
    (this file's, the fused RMSNorm's and SiLU-and-mul's) uses this and fp8_quantize, so their
    bits agree."""
    return tl.maximum(tl.div_rn(amax, 448.0), MIN_SCALE)


@triton.jit
def fp8_quantize(x, scale):
    """float32 values / scale, saturated to +-448 (the caller casts to e4m3 as it stores)."""
    return tl.clamp(tl.div_rn(x, scale), -448.0, 448.0)


@triton.jit
def _quantize_per_token_kernel(
    x_ptr,  # [tokens, K], rows strided, last dimension contiguous
    q_ptr,  # [tokens, K] float8e4nv, contiguous
    scale_ptr,  # [tokens] float32
    x_stride,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (triton_compat.pdl_launch)
):
    """One program per row: the row's amax, then every element divided by amax / 448. A row that
    fits one block is loaded once and kept in registers; a longer one is read twice."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    pdl_wait(PDL)
    if K <= BLOCK:
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < K, other=0.0).to(tl.float32)
        scale = fp8_row_scale(tl.max(tl.abs(x), 0), MIN_SCALE)
        tl.store(scale_ptr + row, scale)
        tl.store(q_ptr + row * K + cols, fp8_quantize(x, scale).to(q_ptr.dtype.element_ty), mask=cols < K)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * x_stride + start + cols, mask=start + cols < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        scale = fp8_row_scale(tl.max(amax, 0), MIN_SCALE)
        tl.store(scale_ptr + row, scale)
        for start in range(0, K, BLOCK):
            mask = start + cols < K
            x = tl.load(x_ptr + row * x_stride + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_ptr + row * K + start + cols, fp8_quantize(x, scale).to(q_ptr.dtype.element_ty), mask=mask)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[tokens, K] -> (fp8 [tokens, K], float32 scale [tokens, 1]) with each row's amax at 448.
    One fused Triton pass on CUDA (two reads of x, one fp8 write), torch elsewhere."""
    if use_triton_for(x):
        return quantize_per_token_triton(x)
    return quantize_per_token_reference(x)


def quantize_per_token_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher; x may have strided rows but its last dimension must be contiguous."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_per_token: x must be 2-D with contiguous rows, got {tuple(x.shape)}.")
    check_same_device(_quantize_per_token_kernel, x=x)
    tokens, k = x.shape
    q = torch.empty((tokens, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((tokens, 1), dtype=torch.float32, device=x.device)
    if tokens:
        block = min(next_power_of_2(k), 4096)
        _quantize_per_token_kernel[(tokens,)](x, q, scale, x.stride(0), K=k, BLOCK=block, MIN_SCALE=MIN_SCALE,
                                              num_warps=8 if block >= 2048 else 4, **pdl_launch(x))
    return q, scale


def quantize_per_token_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch: the same amax, scale and saturating round to e4m3."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()  # [tokens, 1]
    # A tensor divisor: CUDA divides by a Python scalar as a multiply by its reciprocal (1 ulp
    # off the kernel's IEEE division); tensor by tensor is the IEEE division everywhere.
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp(min=MIN_SCALE)
    return quantize_with_scale(x, scale), scale


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3 (saturating at +-448); scale broadcasts against x."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_weight_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] weight -> (fp8 [N, K], float32 scale [N]): one scale per output channel."""
    q, scale = quantize_per_token(w)
    return q, scale.reshape(-1)


def fp8_linear(
    x: torch.Tensor | Fp8Activation,  # [tokens, K] in the model dtype, or already quantized
    w_q: torch.Tensor,  # [N, K] float8_e4m3fn
    w_scale: torch.Tensor,  # [N] float32
    input_scale: torch.Tensor | None,  # [] float32 (static per-tensor) or None (per-token)
    bias: torch.Tensor | None,  # [N]
) -> torch.Tensor:  # [tokens, N] in x's dtype
    """Quantize x (per token unless a static scale is given) and multiply by the FP8 weight.
    An Fp8Activation (per-token, from a fused producer) goes straight to the GEMM."""
    if isinstance(x, Fp8Activation):
        if input_scale is not None:
            raise ValueError("fp8_linear: a layer with a static input scale got per-token FP8 activations.")
        return fp8_scaled_mm(x.q, x.scale, w_q, w_scale, bias, x.dtype)
    if input_scale is None:
        x_q, x_scale = quantize_per_token(x)
    else:
        x_q = quantize_with_scale(x, input_scale)
        x_scale = input_scale.reshape(1, 1).expand(x.shape[0], 1)
    return fp8_scaled_mm(x_q, x_scale, w_q, w_scale, bias, x.dtype)


def fp8_scaled_mm(
    x_q: torch.Tensor,  # [M, K] fp8
    x_scale: torch.Tensor,  # [M, 1] float32
    w_q: torch.Tensor,  # [N, K] fp8
    w_scale: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None,  # [N]
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [M, N]
    if use_triton_for(x_q) and _triton_gemm_ok(x_q, w_q):
        return fp8_gemm_triton(x_q, x_scale, w_q, w_scale, bias, out_dtype)
    if x_q.is_cuda and _cublaslt_shape_ok(x_q, w_q):
        return fp8_scaled_mm_cublaslt(x_q, x_scale, w_q, w_scale, bias, out_dtype)
    return fp8_scaled_mm_reference(x_q, x_scale, w_q, w_scale, bias, out_dtype)


def _triton_gemm_ok(x_q: torch.Tensor, w_q: torch.Tensor) -> bool:
    # Decode's token counts, where the Triton kernel beats cuBLASLt's one config (fp8_gemm_triton).
    return USE_TRITON_GEMM and x_q.shape[0] <= TRITON_MAX_M and x_q.stride(1) == 1 and w_q.is_contiguous()


def _cublaslt_shape_ok(x_q: torch.Tensor, w_q: torch.Tensor) -> bool:
    # cuBLASLt's FP8 GEMM needs K and N in multiples of 16.
    return x_q.shape[1] % 16 == 0 and w_q.shape[0] % 16 == 0


def fp8_scaled_mm_cublaslt(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fast_accum: bool | None = None,  # None: FAST_ACCUM
) -> torch.Tensor:
    """torch._scaled_mm; the weight goes in as w^T, the column-major operand cuBLASLt wants.
    Fast accumulation where cuBLASLt has a kernel for it, else (e.g. row-wise scales at K 14,336
    and a few tokens on an H100) the promoting one; the refusal is remembered per shape."""
    key = (x_q.shape[0], w_q.shape[0], x_q.shape[1], out_dtype, x_q.device)
    fast = (FAST_ACCUM if fast_accum is None else fast_accum) and key not in _NO_FAST_ACCUM
    try:
        return _scaled_mm(x_q, x_scale, w_q, w_scale, bias, out_dtype, fast)
    except RuntimeError as e:
        if not fast or "NOT_SUPPORTED" not in str(e):
            raise
        _NO_FAST_ACCUM.add(key)
        return _scaled_mm(x_q, x_scale, w_q, w_scale, bias, out_dtype, False)


def _scaled_mm(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fast: bool,
) -> torch.Tensor:
    if out_dtype == torch.bfloat16:
        # Row-wise scaling (a scale per row of x and per column of w^T) needs a bf16 output.
        return torch._scaled_mm(
            x_q,
            w_q.t(),
            scale_a=x_scale.float().contiguous(),  # [M, 1]
            scale_b=w_scale.reshape(1, -1).float(),  # [1, N]
            bias=bias,
            out_dtype=out_dtype,
            use_fast_accum=fast,
        )
    one = torch.ones((), dtype=torch.float32, device=x_q.device)
    raw = torch._scaled_mm(x_q, w_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
    return _scale_and_bias(raw, x_scale, w_scale, bias, out_dtype)  # [M, N]


def fp8_scaled_mm_reference(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Plain torch: the integer-valued FP8 products in float32, then the scales and the bias."""
    raw = x_q.float() @ w_q.float().t()  # [M, N] float32
    return _scale_and_bias(raw, x_scale, w_scale, bias, out_dtype)


def _scale_and_bias(
    raw: torch.Tensor,  # [M, N] float32
    x_scale: torch.Tensor,  # [M, 1]
    w_scale: torch.Tensor,  # [N]
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    out = raw * x_scale.float() * w_scale.float().reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
