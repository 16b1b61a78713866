"""Activations: the gated SiLU of Llama-family MLPs and the plain ones OPT's MLP names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.kernels import activation as activation_kernel
from folio.kernels import fp8_gemm
from folio.kernels.triton_compat import use_triton_for


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[tokens, 2 * inter] (gate then up, as MergedColumnLinear stacks them) -> [tokens, inter]."""
    gate, up = x.chunk(2, dim=-1)  # [tokens, inter] each
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """The gated activation of a merged gate_up projection; a module so a kernel can replace it."""

    def forward(self, x: torch.Tensor, fp8_out: bool = False) -> torch.Tensor:
        """fp8_out: on CUDA the result comes quantized per token (fp8_gemm.Fp8Activation) for an
        FP8 layer that takes it (rows up to FP8_OUT_MAX_INTER wide); otherwise ignored."""
        if use_triton_for(x):  # one fused pass on CUDA, same rounding as silu_and_mul
            if fp8_out and fp8_gemm.FUSED_FP8_QUANT and x.shape[-1] // 2 <= activation_kernel.FP8_OUT_MAX_INTER:
                return activation_kernel.silu_and_mul_fp8(x)
            return activation_kernel.silu_and_mul_triton(x)
        return silu_and_mul(x)


# Names as config.json writes them (hidden_act / activation_function) -> elementwise function.
_PLAIN_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
}


class Activation(nn.Module):
    """An ungated elementwise activation chosen by its config name."""

    def __init__(self, name: str) -> None:
        super().__init__()
        if name not in _PLAIN_ACTIVATIONS:
            raise ValueError(
                f"Unsupported activation {name!r}; supported: {sorted(_PLAIN_ACTIVATIONS)}."
            )
        self.name = name
        self.fn = _PLAIN_ACTIVATIONS[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


def gated_activation(name: str) -> nn.Module:
    """The gated activation a Llama-style MLP names in hidden_act (only SiLU occurs)."""
    if name not in ("silu", "swish"):
        raise ValueError(f"Unsupported gated MLP activation {name!r}; supported: ['silu'].")
    return SiluAndMul()
