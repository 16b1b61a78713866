"""Quantized GEMM cases for folio.kernels.benchmark: W4A16 and FP8 at Llama-3.1-8B's shapes.

    python -m folio.kernels.benchmark --only quant [--sweep]      # on a GPU

Decode (M = 1 and 16 tokens) is bound by reading the weight, so each row reports the bytes a
GEMM must move (packed weight, scales, zeros, activations, output) over the measured copy rate;
M = 256 rows (W1's decode batches) also report the matmul rate. `--sweep` times the W4A16
kernel's alternative tile configs and split counts, tl.dot tiles and (at M = 1) the GEMV kernel's
(the candidates for pick_config's small-M table), so one GPU call can choose them (docs/perf-notes.md, "Quantized GEMMs at small M").
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from folio.kernels.fp8_gemm import (
    fp8_linear,
    fp8_scaled_mm_cublaslt,
    fp8_scaled_mm_reference,
    quantize_per_token,
    quantize_weight_per_channel,
)
from folio.kernels.fp8_gemm_triton import fp8_gemm_triton, split_k_for
from folio.kernels.fp8_gemm_triton import pick_config as fp8_pick_config
from folio.kernels.gemv import gemv
from folio.kernels.w4a16_gemm import gemv_split_k, pack_rows, pick_config, w4a16_gemm_triton, w4a16_reference
from folio.kernels.w4a16_gemv import columns_split_k

# Llama-3.1-8B's four GEMMs per layer (QKV and gate/up merged): (name, K, N)
LLAMA_8B_GEMMS = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)]
TINY_GEMMS = [("tiny", 256, 96)]
GROUP = 128
# Candidate W4A16 configs for small M: (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
SWEEP_W4A16 = [
    (64, 64, None, 4, 3), (64, 128, None, 4, 4), (32, 128, None, 4, 4), (128, 128, None, 4, 4),
    (64, 128, 1, 4, 4), (32, 128, 1, 2, 5), (64, 128, 2, 4, 4), (64, 128, 4, 4, 4), (128, 128, 2, 8, 4),
]
# The denormal GEMV step's configs for one token: (BLOCK_N, BLOCK_K, SPLIT_K (None: gemv_split_k's),
# num_warps, num_stages, REDUCE: the split-K sum by each tile's last program instead of a second launch)
SWEEP_GEMV = [
    (64, 128, None, 4, None, 0), (256, 128, None, 8, None, 0), (128, 64, None, 4, None, 0),
    (128, 128, None, 8, None, 0), (128, 128, None, 4, 4, 0), (256, 64, None, 4, None, 0),
    (64, 64, None, 2, None, 0), (128, 128, None, 4, None, 1), (64, 64, None, 2, None, 1),
    (256, 64, None, 4, None, 1), (128, 128, None, 4, 4, 1),
]
# Session 7: the tiled kernel unpacking with int-to-float conversions (MAGIC=0), the way it did
# before: (BLOCK_N, BLOCK_K, num_warps) at pick_config's split; default rows use MAGIC=1.
SWEEP_NO_MAGIC = [(64, 128, 4)]
# The columns step (STEP 3): (BLOCK_N, BLOCK_K, num_warps), BLOCK_N = 256 x num_warps or wider.
SWEEP_GEMV_COLUMNS = [(256, 32, 1), (512, 32, 2), (512, 32, 1), (1024, 32, 4), (256, 64, 1)]


def _gemv_configs(n: int, k: int, sms: int, sweep: bool) -> list[tuple[str, dict]]:
    """One token's A/B rows beside the default (the chains step, session 15): its activations
    loaded in their step, the columns step (session 12-14's default), the denormal step (session
    8's) with its split, prefetch and tile variants, and with `sweep` the columns and chains
    tiles and the denormal sweep (SWEEP_GEMV)."""
    chains = pick_config(1, n, k, GROUP, sms)
    columns = dict(GEMV=1, STEP=3, BLOCK_N=256, BLOCK_K=32, REDUCE=0, num_warps=1, SPLIT_K=columns_split_k(k, 32))
    denormal = dict(GEMV=1, STEP=2, BLOCK_N=128, BLOCK_K=64, REDUCE=1, num_warps=4,
                    SPLIT_K=gemv_split_k(n, k, 128, 64, sms))
    configs = [("chains in-step loads", {**chains, "AHEAD": 0}), ("columns n256", columns),
               ("denormal n128 k64 w4", denormal), ("denormal no prefetch", {**denormal, "PREFETCH": 0}),
               ("denormal second launch", {**denormal, "REDUCE": 0}),
               ("denormal split x2", {**denormal, "SPLIT_K": denormal["SPLIT_K"] * 2}),
               ("denormal split /2", {**denormal, "SPLIT_K": max(1, denormal["SPLIT_K"] // 2)})]
    if not sweep:
        return configs
    for block_n in (64, 256):
        configs.append((f"chains n{block_n}", {**chains, "BLOCK_N": block_n}))
    for block_n, block_k, warps in SWEEP_GEMV_COLUMNS:
        for busy in (16, 8, 4):
            cfg = dict(columns, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                       SPLIT_K=gemv_split_k(n, k, block_n, block_k, sms, busy // warps))
            configs.append((f"columns n{block_n} k{block_k} w{warps} {busy} warps/SM", cfg))
    for block_n, block_k, split_k, warps, stages, reduce in SWEEP_GEMV:
        cfg = dict(GEMV=1, STEP=2, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, REDUCE=reduce)
        cfg["SPLIT_K"] = split_k or gemv_split_k(n, k, block_n, block_k, sms)
        if stages is not None:
            cfg["num_stages"] = stages
        configs.append((f"denormal n{block_n} k{block_k} s{cfg['SPLIT_K']} w{warps} st{stages}{' reduce' * reduce}", cfg))
    return configs


def quant_cases(device, dtype, ceilings, tiny: bool, sweep: bool, row: Callable, tokens: list[int] | None = None) -> list:
    """Rows for the benchmark table; `row` is folio.kernels.benchmark._row; `tokens`: only these M."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, k, n in TINY_GEMMS if tiny else LLAMA_8B_GEMMS:
        for m in tokens or ((1, 16) if tiny else (1, 16, 256)):
            x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
            rows += _w4a16_rows(name, x, n, device, ceilings, sweep and m <= 16, gen, row)
            rows += _fp8_rows(name, x, n, device, ceilings, gen, row)
    return rows


def _w4a16_rows(name, x, n, device, ceilings, sweep, gen, row) -> list:
    m, k = x.shape
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    qweight = pack_rows(q).to(device)
    scales = (torch.rand(k // GROUP, n, generator=gen) * 0.02 + 0.001).to(device)
    want = w4a16_reference(x, qweight, scales, None, GROUP)
    nbytes = qweight.numel() * 4 + scales.numel() * 4 + 2 * x.numel() * x.element_size() + m * n * x.element_size()
    flops = 2 * m * n * k
    default = pick_config(m, n, k, GROUP, _sms(device))
    configs = [("default", None)]
    if m > 1:  # session 7: the tiled kernel unpacking with conversions (MAGIC=0) for the A/B
        configs.append(("default no-magic", {**default, "MAGIC": 0}))
    if m == 1:
        configs += _gemv_configs(n, k, _sms(device), sweep)
    if sweep:
        for block_n, block_k, split_k, warps, stages in SWEEP_W4A16:
            cfg = dict(pick_config(16, n, k, GROUP, _sms(device)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
            cfg["num_stages"] = stages
            if split_k is not None:
                cfg["SPLIT_K"] = split_k
            configs.append((f"dot n{block_n} k{block_k} s{cfg['SPLIT_K']} w{warps} st{stages}", cfg))
        for block_n, block_k, warps in SWEEP_NO_MAGIC:
            cfg = dict(pick_config(16, n, k, GROUP, _sms(device)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                       MAGIC=0)
            configs.append((f"dot n{block_n} k{block_k} w{warps} no-magic", cfg))
    weights = _rotating((qweight, scales), m, device)
    rows = []
    for label, cfg in configs:
        def run(cfg=cfg):
            qw, sc = weights()
            return w4a16_gemm_triton(x, qw, sc, None, GROUP, config=cfg)

        def check(run=run):
            return (run().float() - want.float()).abs().max()

        split = (cfg or default)["SPLIT_K"]
        rows.append(row(f"w4a16 {name} M={m} K={k} N={n} {label} (split {split})", run, check, nbytes, flops, device, ceilings))
    return rows


def _rotating(weights: tuple[torch.Tensor, ...], m: int, device) -> Callable[[], tuple[torch.Tensor, ...]]:
    """A callable giving the weights for the next timed launch. A batch-1 decode streams each
    layer's weights from DRAM once per token; repeated launches on one weight read it from L2
    instead (50 MB on an H100: most of the 8B's one-token GEMMs fit). So at one token the launches
    rotate over copies that together exceed twice the L2."""
    copies = [weights]
    if m == 1 and device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
        per_copy = sum(t.numel() * t.element_size() for t in weights)
        copies += [tuple(t.clone() for t in weights) for _ in range(-(-2 * l2 // per_copy))]
    turn = [0]

    def following() -> tuple[torch.Tensor, ...]:
        turn[0] = (turn[0] + 1) % len(copies)
        return copies[turn[0]]

    return following


def _fp8_rows(name, x, n, device, ceilings, gen, row) -> list:
    m, k = x.shape
    w = (torch.randn(n, k, generator=gen) * 0.02).to(device=device, dtype=x.dtype)
    w_q, w_scale = quantize_weight_per_channel(w)
    want = F.linear(x.float(), (w_q.float() * w_scale[:, None]))
    act = 2 * x.numel() * x.element_size() + m * n * x.element_size()
    flops = 2 * m * n * k

    fp8_weights, bf16_weights = _rotating((w_q, w_scale), m, device), _rotating((w,), m, device)

    def run_fp8():
        q, scale = fp8_weights()
        return fp8_linear(x, q, scale, None, None)

    def check_fp8():
        return ((run_fp8().float() - want).abs().max() / want.abs().max().clamp(min=1e-6)).item()

    def run_bf16():
        return F.linear(x, *bf16_weights())

    def run_gemv():
        return gemv(x, *bf16_weights())

    def check_gemv():
        return ((run_gemv().float() - run_bf16().float()).abs().max() / run_bf16().float().abs().max()).item()

    rows = [
        row(f"fp8 {name} M={m} K={k} N={n} (per-token activations)", run_fp8, check_fp8,
            w_q.numel() + w_scale.numel() * 4 + act, flops, device, ceilings),
        row(f"bf16 {name} M={m} K={k} N={n} (the unquantized GEMM)", run_bf16, lambda: 0.0,
            w.numel() * w.element_size() + act, flops, device, ceilings),
    ]
    if m == 1:  # the Triton GEMV that one-row unquantized layers take on CUDA (folio/kernels/gemv.py)
        rows.append(row(f"bf16 {name} M=1 K={k} N={n} (Triton GEMV)", run_gemv, check_gemv,
                        w.numel() * w.element_size() + act, flops, device, ceilings))
    return rows


# FP8 GEMM: token counts of W1's decode steps (and batch 1) and of small prefill chunks.
FP8_TOKENS = (1, 16, 64, 128, 256, 512)
# Candidate Triton FP8 configs: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); the split
# follows pick_config's rule unless a row says otherwise.
SWEEP_FP8 = [
    (16, 64, 128, 4, 4), (16, 128, 256, 4, 3), (32, 128, 128, 4, 4), (64, 128, 128, 4, 4), (64, 128, 128, 8, 4),
    (64, 64, 128, 4, 5), (128, 128, 128, 8, 3), (64, 256, 128, 8, 3), (128, 64, 128, 4, 4), (32, 64, 256, 4, 3),
]


def fp8_gemm_cases(device, dtype, ceilings, tiny: bool, sweep: bool, row: Callable) -> list:
    """The FP8 GEMM on already-quantized activations (the per-token quantization is the same
    for both): cuBLASLt (torch._scaled_mm) against folio's Triton kernel at its default config,
    its split doubled and halved, and (sweep) other tiles: the rows behind TRITON_MAX_M and
    fp8_gemm_triton.pick_config."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, k, n in TINY_GEMMS if tiny else LLAMA_8B_GEMMS:
        w = (torch.randn(n, k, generator=gen) * 0.02).to(device=device, dtype=dtype)
        w_q, w_scale = quantize_weight_per_channel(w)
        for m in (1, 16) if tiny else FP8_TOKENS:
            x_q, x_scale = quantize_per_token(torch.randn(m, k, generator=gen).to(device=device, dtype=dtype))
            want = fp8_scaled_mm_reference(x_q, x_scale, w_q, w_scale, None, torch.float32)
            nbytes = w_q.numel() + w_scale.numel() * 4 + x_q.numel() + m * 4 + m * n * w.element_size()
            default = fp8_pick_config(m, n, k, _sms(device))
            configs = [("triton default", default),
                       ("triton split x2", {**default, "SPLIT_K": default["SPLIT_K"] * 2}),
                       ("triton split /2", {**default, "SPLIT_K": max(1, default["SPLIT_K"] // 2)})]
            for bm, bn, bk, warps, stages in SWEEP_FP8 if sweep and m in (16, 64, 128, 256) else ():
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
                cfg["SPLIT_K"] = split_k_for(m, n, k, cfg, _sms(device))
                configs.append((f"triton m{bm} n{bn} k{bk} w{warps} st{stages}", cfg))
            runs = [("cublaslt", lambda: fp8_scaled_mm_cublaslt(x_q, x_scale, w_q, w_scale, None, dtype)),
                    ("cublaslt precise", lambda: fp8_scaled_mm_cublaslt(x_q, x_scale, w_q, w_scale, None, dtype,
                                                                       fast_accum=False))] if device.type == "cuda" else []
            runs += [(label, lambda cfg=cfg: fp8_gemm_triton(x_q, x_scale, w_q, w_scale, None, dtype, config=cfg))
                     for label, cfg in configs]
            for label, run in runs:
                def check(run=run):
                    return ((run().float() - want).abs().max() / want.abs().max().clamp(min=1e-6)).item()

                split = next((c["SPLIT_K"] for lab, c in configs if lab == label), "-")
                rows.append(row(f"fp8 gemm {name} M={m} K={k} N={n} {label} (split {split})", run, check,
                                nbytes, 2 * m * n * k, device, ceilings))
    return rows


def _sms(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
