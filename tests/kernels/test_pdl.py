"""Programmatic dependent launch: a decode chain of PDL kernels gives the same bits as plain launches.

Under PDL (Hopper) each kernel of the chain may start while the one before it runs, and waits
(griddepcontrol.wait) before it reads that kernel's output; a misplaced wait shows up as stale
inputs, i.e. different numbers. Where the wait sits in the SASS is checked on any machine
(test_compile_sm90.py); this runs the chain on the GPU, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from folio.kernels import triton_compat
from folio.kernels.activation import silu_and_mul
from folio.kernels.paged_decode import paged_decode
from folio.kernels.rms_norm import rms_norm
from folio.kernels.w4a16_gemm import w4a16_gemm_triton
from tests.kernels.test_w4a16_gemm import _random_int4


def _assert_pdl_chain_matches_plain(monkeypatch, step, inputs) -> None:
    """step(x, residual) run with plain launches, with PDL eagerly, and with PDL replayed from a
    CUDA graph gives the same bits for every input pair."""
    monkeypatch.setattr(triton_compat, "USE_PDL", False)
    plain = [step(x, r) for x, r in inputs]
    monkeypatch.setattr(triton_compat, "USE_PDL", True)
    assert triton_compat.pdl_launch(torch.zeros(1, device="cuda"))["PDL"]
    eager = [step(x, r) for x, r in inputs]
    static_x, static_r = (t.clone() for t in inputs[0])
    step(static_x, static_r)  # compile and size the split-K counters before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(static_x, static_r)
    replayed = []
    for x, r in inputs:
        static_x.copy_(x)
        static_r.copy_(r)
        graph.replay()
        replayed.append(tuple(t.clone() for t in out))
    torch.cuda.synchronize()
    for want, got_eager, got_graph in zip(plain, eager, replayed):
        for w, e, g in zip(want, got_eager, got_graph):
            assert torch.equal(w, e) and torch.equal(w, g)


def test_pdl_is_off_for_cpu_tensors():
    assert triton_compat.pdl_launch(torch.zeros(1)) == {"PDL": False}


@pytest.mark.gpu
def test_decode_chain_with_pdl_matches_plain_launches_eager_and_in_a_graph(monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9.0")
    gen = torch.Generator().manual_seed(0)
    hidden, inter, heads, dim, blocks, block_size = 4096, 14336, 32, 128, 64, 16
    norm_w = (torch.rand(hidden, generator=gen) + 0.5).to("cuda", torch.bfloat16)
    up = _random_int4(hidden, 2 * inter, 128, True, gen, "cuda")[:3]
    down = _random_int4(inter, hidden, 128, False, gen, "cuda")[:3]
    kv = torch.randn(2, blocks, block_size, 8, dim, generator=gen).to("cuda", torch.bfloat16)
    meta = dict(query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device="cuda"),
                seq_lens=torch.tensor([blocks * block_size - 5], dtype=torch.int32, device="cuda"),
                block_tables=torch.arange(blocks, dtype=torch.int32, device="cuda")[None])

    def step(x, residual):  # norm -> GEMV -> SiLU -> GEMV -> norm -> decode attention (split + merge)
        h, residual = rms_norm(x, norm_w, 1e-5, residual)
        a = silu_and_mul(w4a16_gemm_triton(h, *up, 128))
        y = w4a16_gemm_triton(a, *down, 128)
        h2, residual = rms_norm(y, norm_w, 1e-5, residual)
        q = h2.view(1, heads, dim)
        attn = paged_decode(q, kv, meta["query_start_loc"], meta["seq_lens"], meta["block_tables"], 1, 0.08,
                            num_splits=16, min_split_tokens=64)
        return attn.view(1, hidden), residual

    inputs = [tuple(torch.randn(1, hidden, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
              for _ in range(4)]
    _assert_pdl_chain_matches_plain(monkeypatch, step, inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 16, 100])
def test_fp8_chain_with_pdl_matches_plain_launches_eager_and_in_a_graph(monkeypatch, tokens):
    """norm quantizing to FP8 -> Triton FP8 GEMM (+ split-K sum) -> SiLU -> per-token quantization
    -> FP8 GEMM: each PDL kernel waits for the FP8 activations, scales and partials written just before."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9.0")
    from folio.kernels.fp8_gemm import fp8_linear, quantize_weight_per_channel
    from folio.kernels.rms_norm import rms_norm_triton

    gen = torch.Generator().manual_seed(tokens)
    hidden, inter = 4096, 14336
    norm_w = (torch.rand(hidden, generator=gen) + 0.5).to("cuda", torch.bfloat16)
    up = quantize_weight_per_channel((torch.randn(2 * inter, hidden, generator=gen) * 0.02).to("cuda"))
    down = quantize_weight_per_channel((torch.randn(hidden, inter, generator=gen) * 0.02).to("cuda"))

    def step(x, residual):  # the norm quantizes for the first GEMM itself (the fused path)
        h, residual = rms_norm_triton(x, norm_w, 1e-5, residual, fp8_out=True)
        a = silu_and_mul(fp8_linear(h, *up, None, None))
        return fp8_linear(a, *down, None, None), residual

    inputs = [tuple(torch.randn(tokens, hidden, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
              for _ in range(3)]
    _assert_pdl_chain_matches_plain(monkeypatch, step, inputs)
