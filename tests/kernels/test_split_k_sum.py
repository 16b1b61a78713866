"""The split-K sum as a second launch (split_k_sum.sum_partials): split order, bias, many splits."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.split_k_sum import sum_partials


def _in_split_order(parts: torch.Tensor) -> torch.Tensor:
    total = torch.zeros_like(parts[0])
    for part in parts:  # float32, one split after another: the kernel's order
        total += part
    return total


@pytest.mark.parametrize("split_k", [1, 2, 7, 32, 45])  # 45: two chunks of loads, the second partial
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_sum_partials_adds_in_split_order(device, split_k, out_dtype):
    gen = torch.Generator().manual_seed(split_k)
    parts = torch.randn(split_k, 1, 300, generator=gen).to(device)  # 300: a ragged last block of 128
    out = torch.full((1, 300), float("nan"), dtype=out_dtype, device=device)
    assert sum_partials(parts, out) is out
    want = _in_split_order(parts)
    if out_dtype == torch.float32:
        assert torch.equal(out, want)
    else:  # one rounding to bf16 (the CPU interpreter truncates where the GPU rounds to nearest)
        torch.testing.assert_close(out.float(), want, atol=0, rtol=2**-7)


def test_sum_partials_adds_the_bias_once_per_column(device):
    gen = torch.Generator().manual_seed(9)
    parts = torch.randn(3, 130, generator=gen).to(device)
    bias = torch.randn(130, generator=gen).to(device, torch.bfloat16)
    out = sum_partials(parts, torch.empty(1, 130, device=device), bias)
    assert torch.equal(out[0], _in_split_order(parts) + bias.float())
