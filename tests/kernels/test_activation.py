"""SiLU-and-mul against the torch reference."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.activation import silu_and_mul, silu_and_mul_reference, silu_and_mul_triton
from folio.layers.activation import silu_and_mul as layer_silu_and_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [37, 64, 1500])  # odd, power of two, several column blocks
def test_matches_reference(device, dtype, inter):
    x = (torch.randn(5, 2 * inter) * 4).to(device=device, dtype=dtype)
    out = silu_and_mul_triton(x)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out, silu_and_mul_reference(x), atol=tol, rtol=tol)
    torch.testing.assert_close(out, layer_silu_and_mul(x), atol=tol, rtol=tol)


def test_strided_rows(device):
    x = torch.randn(6, 2 * 24 + 8, device=device)[:, : 2 * 24]  # row stride != 2 * inter
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_reference(x), atol=1e-5, rtol=1e-5)


def test_dispatch_on_cpu_is_the_reference():
    x = torch.randn(3, 10)
    assert torch.equal(silu_and_mul(x), silu_and_mul_reference(x))


def test_rejects_odd_width(device):
    with pytest.raises(ValueError, match="2 \\* inter"):
        silu_and_mul_triton(torch.randn(3, 7, device=device))


@pytest.mark.gpu
def test_full_size_bf16():
    x = torch.randn(4096, 2 * 3072, device="cuda", dtype=torch.bfloat16)
    out, ref = silu_and_mul_triton(x), silu_and_mul_reference(x)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=8e-3)
    assert (out == ref).float().mean() > 0.99


@pytest.mark.parametrize("inter", [48, 100, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_out_is_the_per_token_quantization_of_the_product(device, inter, dtype):
    """silu_and_mul_fp8: the same bits as the unfused path the engine takes otherwise."""
    from folio.kernels.activation import silu_and_mul_fp8, silu_and_mul_triton
    from folio.kernels.fp8_gemm import Fp8Activation, quantize_per_token

    gen = torch.Generator().manual_seed(inter)
    x = (torch.randn(5, 2 * inter + 8, generator=gen) * 3).to(device=device, dtype=dtype)[:, : 2 * inter]  # strided rows
    x[1] = 0.0  # an all-zero row takes the minimum scale
    got = silu_and_mul_fp8(x)
    q_ref, scale_ref = quantize_per_token(silu_and_mul_triton(x))
    assert isinstance(got, Fp8Activation) and got.dtype == dtype and got.q.shape == (5, inter)
    assert torch.equal(got.scale, scale_ref)
    assert torch.equal(got.q.view(torch.uint8), q_ref.view(torch.uint8))


def test_fp8_out_refuses_rows_wider_than_it_holds():
    from folio.kernels.activation import FP8_OUT_MAX_INTER, silu_and_mul_fp8

    with pytest.raises(ValueError, match="inter"):
        silu_and_mul_fp8(torch.zeros(1, 2 * FP8_OUT_MAX_INTER + 2))
