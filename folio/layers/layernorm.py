"""Normalization layers: RMSNorm (with an optional fused residual add) and OPT's LayerNorm.

On CUDA RMSNorm runs the fused Triton kernel (folio/kernels/rms_norm.py), which rounds exactly as
the torch code below; elsewhere, or with the kernels switched off (FOLIO_TRITON_KERNELS=0,
triton_compat.set_triton_kernels), the torch code runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.kernels import fp8_gemm
from folio.kernels import rms_norm as rms_norm_kernel
from folio.kernels.triton_compat import use_triton_for


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalize in float32 and scale in the input dtype, the order transformers uses."""
    dtype = x.dtype
    x32 = x.float()
    variance = x32.pow(2).mean(dim=-1, keepdim=True)  # [tokens, 1]
    return weight * (x32 * torch.rsqrt(variance + eps)).to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension.

    forward(x) -> norm(x). forward(x, residual) first adds: s = x + residual, and returns
    (norm(s), s), so a decoder layer passes the running residual stream along without an extra
    add; one fused kernel can later do both.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, fp8_out: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """fp8_out: on CUDA the output comes quantized per token (fp8_gemm.Fp8Activation) for an
        FP8 linear layer that takes it; elsewhere it is ignored (that layer quantizes)."""
        if use_triton_for(x):  # x may be a strided [tokens, heads, head_dim] view (q/k norms)
            fp8_out = fp8_out and fp8_gemm.FUSED_FP8_QUANT
            return rms_norm_kernel.rms_norm_triton(x, self.weight, self.eps, residual, fp8_out=fp8_out)
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        summed = x + residual  # [tokens, hidden]
        return rms_norm(summed, self.weight, self.eps), summed

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; affine=False keeps no weight or bias (as OPT allows)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size)) if affine else None
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, affine={self.weight is not None}"
