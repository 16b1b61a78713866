"""FP8 W8A8 GEMM: per-token activation quantization, the float32 reference, and cuBLASLt
(torch._scaled_mm) against that reference on the GPU at odd token counts."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.fp8_gemm import (
    FP8_MAX,
    fp8_linear,
    fp8_scaled_mm_cublaslt,
    fp8_scaled_mm_reference,
    quantize_per_token,
    quantize_per_token_reference,
    quantize_per_token_triton,
    quantize_weight_per_channel,
)


def test_per_token_quantization_puts_each_rows_amax_at_448():
    x = torch.randn(5, 48) * torch.tensor([0.01, 1, 100, 0, 3]).reshape(5, 1)
    q, scale = quantize_per_token(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    amax = q.float().abs().amax(-1)
    assert torch.equal(amax[[0, 1, 2, 4]], torch.full((4,), FP8_MAX)) and amax[3] == 0
    torch.testing.assert_close(q.float() * scale, x, rtol=0.07, atol=1e-6)


@pytest.mark.parametrize(("tokens", "k"), [(1, 48), (5, 100), (3, 5000)])
def test_triton_per_token_quantization_is_bit_exact(device, tokens, k):
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(tokens, k + 3, generator=gen) * 5).to(device)[:, :k]  # strided rows
    x[0, :] = 0.0  # an all-zero row takes the minimum scale
    q, scale = quantize_per_token_triton(x)
    q_ref, scale_ref = quantize_per_token_reference(x)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_reference_is_the_float_product_within_fp8_error():
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(7, 64, generator=gen), torch.randn(40, 64, generator=gen), torch.randn(40, generator=gen)
    w_q, w_scale = quantize_weight_per_channel(w)
    out = fp8_linear(x, w_q, w_scale, None, b)
    exact = x @ w.t() + b
    assert (out - exact).abs().max() < 0.1 * exact.abs().max()
    static = fp8_linear(x, w_q, w_scale, torch.tensor(x.abs().max().item() / FP8_MAX), b)
    assert (static - exact).abs().max() < 0.1 * exact.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 33, 256])
@pytest.mark.parametrize(("k", "n"), [(4096, 6144), (14336, 4096), (64, 48)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_cublaslt_matches_reference(m, k, n, out_dtype):
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=gen, device="cuda").to(out_dtype)
    w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
    bias = torch.randn(n, generator=gen, device="cuda").to(out_dtype)
    x_q, x_scale = quantize_per_token(x)
    w_q, w_scale = quantize_weight_per_channel(w)
    got = fp8_scaled_mm_cublaslt(x_q, x_scale, w_q, w_scale, bias, out_dtype)
    expected = fp8_scaled_mm_reference(x_q, x_scale, w_q, w_scale, bias, torch.float32)
    assert got.dtype == out_dtype and got.shape == (m, n)
    torch.testing.assert_close(got.float(), expected, rtol=1.6e-2, atol=1e-2 * expected.abs().max().item())


@pytest.mark.parametrize(("m", "k", "n", "split"), [(1, 256, 128, 1), (5, 320, 200, 2), (33, 512, 96, 4), (17, 200, 64, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_triton_gemm_matches_reference(device, m, k, n, split, with_bias):
    """Odd token counts, N and K that are not tile multiples, split-K with a partial last split."""
    from folio.kernels.fp8_gemm_triton import fp8_gemm_triton

    gen = torch.Generator().manual_seed(m * k + n)
    x = (torch.randn(m, k + 16, generator=gen) * 3).to(device)[:, :k]  # strided rows
    w = torch.randn(n, k, generator=gen).to(device) * 0.05
    bias = torch.randn(n, generator=gen).to(device=device, dtype=torch.bfloat16) if with_bias else None
    x_q, x_scale = quantize_per_token(x)
    w_q, w_scale = quantize_weight_per_channel(w)
    config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": split, "num_warps": 4}
    got = fp8_gemm_triton(x_q, x_scale, w_q, w_scale, bias, torch.bfloat16, config=config)
    expected = fp8_scaled_mm_reference(x_q, x_scale, w_q, w_scale, bias, torch.float32)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    if split == 1:  # the default config (every tile config reads the same bytes)
        again = fp8_gemm_triton(x_q, x_scale, w_q, w_scale, bias, torch.bfloat16)
        torch.testing.assert_close(again.float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())


def test_triton_gemm_rejects_what_it_cannot_read():
    from folio.kernels.fp8_gemm_triton import fp8_gemm_triton

    x_q, x_scale = quantize_per_token(torch.randn(4, 64))
    w_q, w_scale = quantize_weight_per_channel(torch.randn(32, 64))
    with pytest.raises(ValueError, match="2-D float8_e4m3fn"):
        fp8_gemm_triton(x_q.float(), x_scale, w_q, w_scale, None, torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous w_q"):
        fp8_gemm_triton(x_q, x_scale, w_q[:, :32], w_scale, None, torch.bfloat16)
    with pytest.raises(ValueError, match="bias must be"):
        fp8_gemm_triton(x_q, x_scale, w_q, w_scale, torch.zeros(31), torch.bfloat16)
    with pytest.raises(ValueError, match="bias must be"):
        fp8_gemm_triton(x_q, x_scale, w_q, w_scale, torch.zeros(64)[::2], torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 16, 33, 64, 255])
@pytest.mark.parametrize(("k", "n"), [(4096, 6144), (14336, 4096), (4096, 28672), (96, 48)])
def test_triton_gemm_matches_reference_at_model_shapes(m, k, n):
    """The Triton kernel at its default configs (split-K at decode sizes) on the GPU, also past
    the token counts the dispatcher sends it."""
    from folio.kernels.fp8_gemm_triton import fp8_gemm_triton

    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
    bias = torch.randn(n, generator=gen, device="cuda").to(torch.bfloat16)
    x_q, x_scale = quantize_per_token(x)
    w_q, w_scale = quantize_weight_per_channel(w)
    got = fp8_gemm_triton(x_q, x_scale, w_q, w_scale, bias, torch.bfloat16)
    expected = fp8_scaled_mm_reference(x_q, x_scale, w_q, w_scale, bias, torch.float32)
    torch.testing.assert_close(got.float(), expected, rtol=1.6e-2, atol=1e-2 * expected.abs().max().item())


def test_cublaslt_without_a_fast_accumulation_kernel_falls_back_once_per_shape(monkeypatch):
    """cuBLASLt refuses fast accumulation for some shapes (CUBLAS_STATUS_NOT_SUPPORTED): the call
    is retried with the promoting kernel, the shape remembered, other errors raised."""
    import folio.kernels.fp8_gemm as fp8_gemm

    calls = []

    def scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None, use_fast_accum=False):
        calls.append(use_fast_accum)
        if use_fast_accum:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmulAlgoGetHeuristic`")
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    monkeypatch.setattr(fp8_gemm, "FAST_ACCUM", True)
    monkeypatch.setattr(fp8_gemm, "_NO_FAST_ACCUM", set())
    x_q, x_scale = quantize_per_token(torch.randn(3, 32))
    w_q, w_scale = quantize_weight_per_channel(torch.randn(16, 32))
    for _ in range(2):
        out = fp8_scaled_mm_cublaslt(x_q, x_scale, w_q, w_scale, None, torch.bfloat16)
        assert out.shape == (3, 16) and out.dtype == torch.bfloat16
    assert calls == [True, False, False]  # refused once, then straight to the promoting kernel

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "_scaled_mm", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        fp8_scaled_mm_cublaslt(x_q[:2], x_scale[:2], w_q, w_scale, None, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [128, 129])
def test_dispatch_on_both_sides_of_the_triton_limit(m):
    """fp8_linear at TRITON_MAX_M tokens (the Triton kernel) and one more (cuBLASLt)."""
    from folio.kernels.fp8_gemm_triton import TRITON_MAX_M

    assert TRITON_MAX_M == 128
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    w_q, w_scale = quantize_weight_per_channel(torch.randn(1024, 4096, generator=gen, device="cuda") * 0.02)
    got = fp8_linear(x, w_q, w_scale, None, None)
    x_q, x_scale = quantize_per_token(x)
    expected = fp8_scaled_mm_reference(x_q, x_scale, w_q, w_scale, None, torch.float32)
    assert got.dtype == torch.bfloat16 and got.shape == (m, 1024)
    torch.testing.assert_close(got.float(), expected, rtol=1.6e-2, atol=1.2e-2 * expected.abs().max().item())
