"""The one-row GEMV (batch-1 decode's linear layers) against a float32 matmul, at odd shapes."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.gemv import gemv, gemv_reference, use_gemv


@pytest.mark.parametrize(("n", "k", "split_k", "block_n", "block_k"),
                         [(37, 64, 1, 16, 32), (40, 200, 2, 16, 32), (9, 96, 3, 32, 32), (64, 256, None, 32, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_float32_matmul(device, n, k, split_k, block_n, block_k, with_bias):
    gen = torch.Generator().manual_seed(n * k)
    dtype = torch.bfloat16
    x = torch.randn(1, k, generator=gen).to(device, dtype)
    w = torch.randn(n, k, generator=gen).to(device, dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype) if with_bias else None
    out = gemv(x, w, bias, split_k=split_k, block_n=block_n, block_k=block_k)
    want = x.float() @ w.float().t() + (bias.float() if with_bias else 0)
    assert out.shape == (1, n) and out.dtype == dtype
    # float32 sums in another order, one rounding to bf16 (2^-8 relative)
    torch.testing.assert_close(out.float(), want, atol=1e-2 * want.abs().max().item(), rtol=1e-2)
    torch.testing.assert_close(out, gemv_reference(x, w, bias), atol=2e-2 * want.abs().max().item(), rtol=2e-2)


def test_gemv_split_sum_is_in_split_order_so_repeats_are_bit_equal(device):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 512, generator=gen).to(device, torch.bfloat16)
    w = torch.randn(48, 512, generator=gen).to(device, torch.bfloat16)
    first = gemv(x, w, split_k=4, block_n=16, block_k=32)
    assert all(torch.equal(first, gemv(x, w, split_k=4, block_n=16, block_k=32)) for _ in range(3))


@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_split_sum_by_second_launch_equals_the_last_program_sum(device, monkeypatch, with_bias):
    """The two places the partials are added (gemv.SPLIT_SUM) add them in the same order: same bits."""
    from folio.kernels import gemv as gemv_module

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 320, generator=gen).to(device, torch.bfloat16)
    w = torch.randn(50, 320, generator=gen).to(device, torch.bfloat16)
    bias = torch.randn(50, generator=gen).to(device, torch.bfloat16) if with_bias else None
    out = {}
    for where in ("launch", "last"):
        monkeypatch.setattr(gemv_module, "SPLIT_SUM", where)
        out[where] = gemv(x, w, bias, split_k=5, block_n=16, block_k=32)
    assert torch.equal(out["launch"], out["last"])
    torch.testing.assert_close(out["launch"], gemv_reference(x, w, bias), atol=0.05, rtol=0.02)


def test_gemv_rejects_bad_shapes_and_dispatch_needs_one_cuda_row():
    w = torch.zeros(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x must be"):
        gemv(torch.zeros(2, 64, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="bias must be"):
        gemv(torch.zeros(1, 64, dtype=torch.bfloat16), w, torch.zeros(7, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous along K"):
        gemv(torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(64, 8, dtype=torch.bfloat16).t())
    assert not use_gemv(torch.zeros(1, 64, dtype=torch.bfloat16), w)  # CPU: the torch path


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (4096, 1024),
                                      (1024, 3072), (151936, 1024), (2049, 1000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_full_size_gemv_matches_cublas(n, k, dtype):
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to("cuda", dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to("cuda", dtype)
    bias = torch.randn(n, generator=gen).to("cuda", dtype)
    assert use_gemv(x, w)
    out = gemv(x, w, bias)
    want = x.float() @ w.float().t() + bias.float()
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)
    cublas = torch.nn.functional.linear(x, w, bias)
    torch.testing.assert_close(out, cublas, atol=2e-2, rtol=2e-2)
