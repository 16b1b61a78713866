"""RMSNorm with fused residual add against the torch reference (and the layer's own function)."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.rms_norm import rms_norm, rms_norm_reference, rms_norm_triton
from folio.layers.layernorm import rms_norm as layer_rms_norm

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [40, 64, 100])
def test_matches_reference(device, dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(9, hidden, generator=gen) * 3).to(device=device, dtype=dtype)
    weight = torch.randn(hidden, generator=gen).to(device=device, dtype=dtype)
    out = rms_norm_triton(x, weight, 1e-6)
    tol = TOL[dtype]
    torch.testing.assert_close(out, rms_norm_reference(x, weight, 1e-6), atol=tol, rtol=tol)
    torch.testing.assert_close(out, layer_rms_norm(x, weight, 1e-6), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_residual(device, dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 48, generator=gen).to(device=device, dtype=dtype)
    residual = torch.randn(7, 48, generator=gen).to(device=device, dtype=dtype)
    weight = torch.randn(48, generator=gen).to(device=device, dtype=dtype)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = rms_norm_triton(x, weight, 1e-5, residual)
    ref_out, ref_residual = rms_norm_reference(x, weight, 1e-5, residual)
    tol = TOL[dtype]
    torch.testing.assert_close(new_residual, ref_residual, atol=tol, rtol=tol)
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before), "inputs are not modified"


def test_per_head_norm_on_strided_qkv_view(device):
    # Qwen3's q_norm: [tokens, heads, head_dim] read straight out of the fused qkv output.
    tokens, heads, dim = 5, 3, 32
    qkv = torch.randn(tokens, (heads + 2) * dim, device=device)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    weight = torch.randn(dim, device=device)
    out = rms_norm_triton(q, weight, 1e-6)
    assert out.shape == (tokens, heads, dim) and out.is_contiguous()
    torch.testing.assert_close(out, rms_norm_reference(q, weight, 1e-6), atol=1e-5, rtol=1e-5)


def test_dispatch_on_cpu_is_the_reference():
    x, weight = torch.randn(3, 16), torch.randn(16)
    assert torch.equal(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))


def test_rejects_bad_inputs(device):
    x = torch.randn(3, 16, device=device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(x, torch.randn(8, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_triton(x, torch.randn(16, device=device), 1e-6, torch.randn(3, 8, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024, 4096])
def test_full_size_bf16_matches_reference_rounding(hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    x = torch.randn(2048, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    residual = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    out, new_residual = rms_norm_triton(x, weight, 1e-6, residual)
    ref_out, ref_residual = rms_norm_reference(x, weight, 1e-6, residual)
    assert torch.equal(new_residual, ref_residual)
    # Same rounding order as torch: differences only from float32 reduction order. One ulp of the
    # normalized value can become two of its product with the weight (rounded twice): an H100
    # run saw one element in 2M two ulps off (session 11), so two ulps are allowed.
    torch.testing.assert_close(out, ref_out, atol=1e-2, rtol=1.6e-2)
    assert (out == ref_out).float().mean() > 0.99


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("hidden", [64, 100])
def test_fp8_out_is_the_per_token_quantization_of_the_norm(device, with_residual, hidden):
    """fp8_out: the same bits as quantize_per_token(rms_norm(...)), the unfused path the engine
    takes otherwise (the Triton quantization on CUDA, the reference elsewhere); the residual
    unchanged."""
    from folio.kernels.fp8_gemm import Fp8Activation, quantize_per_token

    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(6, hidden, generator=gen) * 4).to(device=device, dtype=torch.bfloat16)
    x[2] = 0.0  # an all-zero row (no residual) takes the minimum scale
    residual = torch.randn(6, hidden, generator=gen).to(device=device, dtype=torch.bfloat16) if with_residual else None
    weight = torch.randn(hidden, generator=gen).to(device=device, dtype=torch.bfloat16)
    got = rms_norm_triton(x, weight, 1e-6, residual, fp8_out=True)
    plain = rms_norm_triton(x, weight, 1e-6, residual)
    if with_residual:
        (got, got_residual), (plain, plain_residual) = got, plain
        assert torch.equal(got_residual, plain_residual)
    assert isinstance(got, Fp8Activation) and got.dtype == torch.bfloat16 and got.scale.shape == (6, 1)
    q_ref, scale_ref = quantize_per_token(plain)
    assert torch.equal(got.scale, scale_ref)
    assert torch.equal(got.q.view(torch.uint8), q_ref.view(torch.uint8))
