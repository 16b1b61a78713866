"""RMSNorm with an optional fused residual add.

Design: one program per row; the row (hidden <= 8192, e.g. 1024 x bf16 = 2 KiB for Qwen3-0.6B)
is loaded once with 16-byte accesses, summed with the residual, written back as the new residual,
reduced in float32 and normalised, all from registers: 2 reads + 2 writes of the row instead of
the 4 reads + 3 writes of the unfused torch ops. Rows may be strided views (a [tokens, heads,
head_dim] slice of a fused qkv output for Qwen3's per-head q/k norms): rows are addressed by two
indices with their own strides; only the last dimension must be contiguous.

Rounding follows the torch path exactly (transformers' order): the sum is rounded to the input
dtype, normalised in float32, rounded to the input dtype, then multiplied by the weight and
rounded again, so the GPU path reproduces the CPU path's values.
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
def _rms_norm_kernel(
    out_ptr,  # [rows, hidden] contiguous
    residual_out_ptr,  # [rows, hidden] contiguous (HAS_RESIDUAL)
    x_ptr,  # [outer, inner, hidden]
    residual_ptr,  # [outer, inner, hidden] (HAS_RESIDUAL)
    weight_ptr,  # [hidden]
    eps,
    inner,
    x_stride_0,
    x_stride_1,
    r_stride_0,
    r_stride_1,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch: the weight is read before gdc_wait
    FP8_OUT: tl.constexpr = False,  # out_ptr is float8e4nv: the row quantized with its own scale
    scale_ptr=None,  # [rows] float32 (FP8_OUT)
    MIN_SCALE: tl.constexpr = 0.0,  # (FP8_OUT) fp8_gemm.MIN_SCALE
):
    row = tl.program_id(0).to(tl.int64)
    i, j = row // inner, row % inner
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    dtype = x_ptr.dtype.element_ty
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    x = tl.load(x_ptr + i * x_stride_0 + j * x_stride_1 + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + i * r_stride_0 + j * r_stride_1 + cols, mask=mask, other=0.0)
        x = (x + r.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + row * HIDDEN + cols, x, mask=mask)
        x = x.to(tl.float32)
    variance = tl.sum(x * x, 0) / HIDDEN
    rstd = tl.div_rn(1.0, tl.sqrt_rn(variance + eps))
    normed = (x * rstd).to(dtype).to(tl.float32)
    y = (normed * w).to(dtype)
    if FP8_OUT:  # fp8_gemm.quantize_per_token's arithmetic on the rounded row, still in registers
        y = y.to(tl.float32)
        scale = fp8_row_scale(tl.max(tl.abs(y), 0), MIN_SCALE)
        tl.store(scale_ptr + row, scale)
        y = fp8_quantize(y, scale)
    tl.store(out_ptr + row * HIDDEN + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """norm(x), or with residual: s = x + residual and (norm(s), s). Triton on CUDA, else torch."""
    if use_triton_for(x):
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_reference(x, weight, eps, residual)


def rms_norm_triton(
    x: torch.Tensor,  # [..., hidden], at most 3-D
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., hidden], same shape as x
    fp8_out: bool = False,
) -> torch.Tensor | Fp8Activation | tuple[torch.Tensor | Fp8Activation, torch.Tensor]:
    """Triton launcher; outputs are new contiguous tensors in x's dtype. fp8_out: the normalized
    rows come out quantized per token for an FP8 linear layer (fp8_gemm.Fp8Activation), the same
    bits as quantize_per_token(rms_norm(...)) in one kernel instead of two."""
    hidden = x.shape[-1]
    _check(x, weight, residual)
    tensors = {"x": x, "weight": weight} | ({"residual": residual} if residual is not None else {})
    check_same_device(_rms_norm_kernel, **tensors)
    x3 = _as_3d(x)  # [outer, inner, hidden]
    r3 = _as_3d(residual) if residual is not None else x3
    out = torch.empty(x.shape, dtype=FP8_DTYPE if fp8_out else x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if fp8_out else None
    rows = x3.shape[0] * x3.shape[1]
    if rows > 0:
        block = next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            out,
            residual_out,
            x3,
            r3,
            weight,
            eps,
            x3.shape[1],
            x3.stride(0),
            x3.stride(1),
            r3.stride(0),
            r3.stride(1),
            HIDDEN=hidden,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(max(block // 256, 1), 8),
            **pdl_launch(x),
            **({"FP8_OUT": True, "scale_ptr": scale, "MIN_SCALE": MIN_SCALE} if fp8_out else {}),
        )
    result = Fp8Activation(out, scale, x.dtype) if fp8_out else out
    return (result, residual_out) if residual is not None else result


def rms_norm_reference(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, in transformers' order: float32 statistics, scale in the input dtype."""
    summed = x + residual if residual is not None else x  # [..., hidden]
    dtype = summed.dtype
    x32 = summed.float()
    variance = x32.pow(2).mean(dim=-1, keepdim=True)  # [..., 1]
    out = (weight * (x32 * torch.rsqrt(variance + eps)).to(dtype)).to(dtype)
    return (out, summed) if residual is not None else out


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 1:
        return t.view(1, 1, -1)
    if t.dim() == 2:
        return t.unsqueeze(1)
    if t.dim() == 3:
        return t
    return t.reshape(-1, t.shape[-2], t.shape[-1])  # rare; may copy


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    hidden = x.shape[-1]
    check_dtype("x", x, _FLOATS)
    check_dtype("weight", weight, _FLOATS)
    if weight.shape != (hidden,) or weight.stride(0) != 1:
        raise ValueError(f"weight must be a contiguous [{hidden}], got {tuple(weight.shape)}.")
    if hidden > 16384:
        raise ValueError(f"hidden size up to 16384 is supported, got {hidden}.")
    if x.stride(-1) != 1:
        raise ValueError("x must be contiguous in its last dimension.")
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual must match x: {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}.")
        if residual.stride(-1) != 1:
            raise ValueError("residual must be contiguous in its last dimension.")
