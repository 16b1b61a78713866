"""The quantized-GEMM benchmark's tiny run on the CPU: every case checks against its reference
(the row's max_err) and counts the bytes a GEMM must move."""

from __future__ import annotations

import torch

from folio.kernels.benchmark import _row
from folio.kernels.benchmark_quant import quant_cases


def test_tiny_quant_cases_check_and_count_bytes():
    rows = quant_cases(torch.device("cpu"), torch.float32, (3.0e12, 785e12), tiny=True, sweep=False, row=_row)
    labels = [r.case.split(" (")[0] for r in rows]
    one, sixteen = "w4a16 tiny M=1 K=256 N=96", "w4a16 tiny M=16 K=256 N=96"
    variants = ["default", "chains in-step loads", "columns n256", "denormal n128 k64 w4", "denormal no prefetch",
                "denormal second launch", "denormal split x2", "denormal split /2"]  # the A/B rows at one token
    n = len(variants)
    assert labels[:n] == [f"{one} {v}" for v in variants]
    assert labels[n + 2] == "bf16 tiny M=1 K=256 N=96" and rows[n + 2].case.endswith("(Triton GEMV)")
    assert labels[n + 3:n + 5] == [f"{sixteen} default", f"{sixteen} default no-magic"]
    assert [r.case.split()[0] for r in rows] == ["w4a16"] * n + ["fp8", "bf16", "bf16"] + ["w4a16"] * 2 + ["fp8", "bf16"]
    for r in rows:
        assert r.bytes > 0 and r.flops > 0 and r.median_us > 0
        assert r.max_err < (5e-2 if r.case.startswith("fp8") else 1e-3), r
    w4a16 = rows[0]
    assert w4a16.bytes < rows[n + 1].bytes / 3  # packed int4 + scales against the float32 weight
