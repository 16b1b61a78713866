"""One-token linear layers back to back in one CUDA graph, as a batch-1 decode runs them.

A kernel bench times one GEMV by itself; in a decode each GEMV follows another kernel in the
graph (under PDL, overlapping it), and what a token pays per GEMV beyond its bytes (ramp, tail,
the split-K sum, the wait for the kernel ahead) is what this script measures (issues 11, 13):

    python3 scripts/gemv_chain.py --model 8b --kind int4 --variants default,ms2,c256k32w1m4n
    python3 scripts/gemv_chain.py --model 0.6b --kind bf16 --variants gemv,cublas

For each variant it prints, us per GEMV and the DRAM rate:
- `layer`: layers of norm -> QKV -> O -> norm(+residual) -> gate_up -> SiLU-and-mul -> down (no
  attention: O reads the first rows of QKV's output), weights distinct per layer, so every
  GEMV streams its weights from DRAM as in a decode;
- one row per shape: the same GEMV `--layers` times in a row (distinct weights, one input), and
  `fixed`: that time minus the bytes at the DRAM peak (3.35 TB/s on an H100 SXM) is each GEMV's
  cost beyond streaming.
Variants: int4 `default` (pick_config), `msN` (columns loop, at least N steps a split),
`denormal` (session 8's tiles), `c<N>k<K>w<warps>m<min steps>[n][r<regs>]` (columns tiles; n: words
with Triton's default L2 policy, not evict-first; r: a register cap), `h<N>w<warps>m<min steps>[r<regs>][a]`
(the chains step, STEP 4; a: activations and scales one step ahead); bf16 `gemv` (folio/kernels/gemv.py), `gemv-kB`
(BLOCK_K B), `g<N>k<K>w<warps>b<programs per SM>`, `cublas`. FOLIO_GEMV_EVICT=0 turns the bf16 GEMV's evict-first loads off.
`x:<qkv>+<o>+<gate_up>+<down>` takes one int4 variant per shape.
FOLIO_PDL=0 in the environment turns programmatic dependent launch off for a whole run.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# (hidden, q + k + v width, o's input, intermediate, layers) of the two benchmark models.
MODELS = {"8b": (4096, 6144, 4096, 14336, 32), "0.6b": (1024, 4096, 2048, 3072, 28)}
PEAK_TB_S = 3.35
GROUP = 128


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """name -> (K, N) of a layer's four linear layers."""
    hidden, qkv, o_in, inter, _ = MODELS[model]
    return {"qkv": (hidden, qkv), "o": (o_in, hidden), "gate_up": (hidden, 2 * inter), "down": (inter, hidden)}


def int4_config(variant: str, k: int, n: int) -> dict | None:
    from folio.kernels.w4a16_gemm import pick_config
    from folio.kernels.w4a16_gemv import columns_split_k

    if variant == "default":
        return None
    if variant.startswith("x:"):  # x:<qkv>+<o>+<gate_up>+<down>: a variant per shape (either model's)
        parts = variant[2:].split("+")
        for model in MODELS:
            for part, dims in zip(parts, shapes(model).values()):
                if dims == (k, n):
                    return int4_config(part, k, n)
        raise SystemExit(f"{variant!r}: no shape {k}x{n}, or fewer than 4 parts")
    columns = {"GEMV": 1, "STEP": 3, "BLOCK_N": 256, "BLOCK_K": 32, "REDUCE": 0, "num_warps": 1}
    if variant.startswith("c"):  # c<BLOCK_N>k<BLOCK_K>w<warps>m<MIN_STEPS>[n][r<regs>]: the columns loop
        m = re.fullmatch(r"c(\d+)k(\d+)w(\d+)m(\d+)(n?)(?:r(\d+))?", variant)
        if m is None:
            raise SystemExit(f"bad columns variant {variant!r}")
        block_n, block_k, warps, min_steps = (int(v) for v in m.groups()[:4])
        cap = {"maxnreg": int(m.group(6))} if m.group(6) else {}
        return {**columns, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps,
                "SPLIT_K": columns_split_k(k, block_k, min_steps), "EVICT": int(not m.group(5)), **cap}
    if variant.startswith("h"):  # h<BLOCK_N>w<warps>m<MIN_STEPS>[r<regs>][a]: the chains loop (STEP 4)
        m = re.fullmatch(r"h(\d+)w(\d+)m(\d+)(?:r(\d+))?(a?)", variant)
        if m is None:
            raise SystemExit(f"bad chains variant {variant!r}")
        block_n, warps, min_steps = (int(v) for v in m.groups()[:3])
        cap = {"maxnreg": int(m.group(4))} if m.group(4) else {}
        return {**columns, "STEP": 4, "BLOCK_N": block_n, "num_warps": warps, "AHEAD": int(bool(m.group(5))),
                "SPLIT_K": columns_split_k(k, 32, min_steps), **cap}
    if variant.startswith("ms"):
        return {**columns, "SPLIT_K": columns_split_k(k, 32, int(variant[2:]))}
    if variant == "denormal":
        cfg = {"GEMV": 1, "STEP": 2, "BLOCK_N": 128, "BLOCK_K": 64, "REDUCE": 1, "num_warps": 4}
        from folio.kernels.w4a16_gemv import gemv_split_k
        return {**cfg, "SPLIT_K": gemv_split_k(n, k, 128, 64, torch.cuda.get_device_properties(0).multi_processor_count, 4)}
    raise SystemExit(f"unknown int4 variant {variant!r}; pick_config gives {pick_config(1, n, k, GROUP)}")


def make_linear(kind: str, variant: str, k: int, n: int, gen: torch.Generator) -> tuple[Callable, int]:
    """(x [1, K] -> [1, N], weight bytes) for a fresh random weight."""
    if kind == "int4":
        from folio.kernels.w4a16_gemm import w4a16_gemm_triton

        qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int32, device="cuda")
        scales = torch.rand(k // GROUP, n, generator=gen, device="cuda") * 0.02 + 1e-3
        cfg = int4_config(variant, k, n)
        return (lambda x: w4a16_gemm_triton(x, qweight, scales, None, GROUP, config=dict(cfg) if cfg else None),
                qweight.numel() * 4 + scales.numel() * 4)
    from folio.kernels.gemv import gemv

    weight = (torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02)
    nbytes = weight.numel() * 2
    if variant == "cublas":
        return (lambda x: F.linear(x, weight)), nbytes
    if variant == "gemv":
        return (lambda x: gemv(x, weight)), nbytes
    if variant.startswith("g") and not variant.startswith("gemv"):  # g<BLOCK_N>k<BLOCK_K>w<warps>b<busy>
        m = re.fullmatch(r"g(\d+)k(\d+)w(\d+)b(\d+)", variant)
        if m is None:
            raise SystemExit(f"bad bf16 GEMV variant {variant!r}")
        bn, bk, warps, busy = (int(v) for v in m.groups())
        return (lambda x: gemv(x, weight, block_n=bn, block_k=bk, num_warps=warps, busy=busy)), nbytes
    if variant.startswith("gemv-k"):
        block_k = int(variant[6:])
        return (lambda x: gemv(x, weight, block_k=block_k)), nbytes
    raise SystemExit(f"unknown bf16 variant {variant!r}")


def graph_ms(body: Callable[[], None], replays: int = 20) -> float:
    """Median ms of one replay of a CUDA graph of `body`."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def layer_chain(model: str, kind: str, variant: str, layers: int, gen: torch.Generator) -> tuple[float, int]:
    """(ms per replay, weight bytes) of `layers` layers' linear layers with their norms."""
    from folio.kernels.activation import silu_and_mul
    from folio.kernels.rms_norm import rms_norm

    hidden = MODELS[model][0]
    dims = shapes(model)
    weights = [{name: make_linear(kind, variant, k, n, gen) for name, (k, n) in dims.items()} for _ in range(layers)]
    norm_w = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    h0 = torch.randn(1, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    o_in = dims["o"][0]

    def body() -> None:
        h, residual = h0, h0.clone()
        for layer in weights:
            x, residual = rms_norm(h, norm_w, 1e-5, residual)
            qkv = layer["qkv"][0](x)
            h = layer["o"][0](qkv[:, :o_in].contiguous())  # O's input is narrower than QKV's output in both models
            x, residual = rms_norm(h, norm_w, 1e-5, residual)
            h = layer["down"][0](silu_and_mul(layer["gate_up"][0](x)))

    return graph_ms(body), sum(nbytes for layer in weights for _, nbytes in layer.values())


def shape_chain(kind: str, variant: str, k: int, n: int, count: int, gen: torch.Generator) -> tuple[float, int]:
    """(ms per replay, weight bytes) of `count` GEMVs of one shape, distinct weights, one input."""
    linears = [make_linear(kind, variant, k, n, gen) for _ in range(count)]
    x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)

    def body() -> None:
        for fn, _ in linears:
            fn(x)

    return graph_ms(body), sum(nbytes for _, nbytes in linears)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="8b")
    parser.add_argument("--kind", choices=["int4", "bf16"], default="int4")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--layers", type=int, default=0, help="layers in the layer chain (default: the model's)")
    parser.add_argument("--count", type=int, default=32, help="GEMVs in each one-shape chain")
    parser.add_argument("--no-shapes", action="store_true", help="only the layer chain")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemv_chain: needs a CUDA device (it times CUDA graphs).")
    layers = args.layers or MODELS[args.model][4]
    print(f"# {torch.cuda.get_device_name(0)}  model {args.model}  {args.kind}  PDL {os.environ.get('FOLIO_PDL', '1')}")
    print("| variant | chain | us per | GB | TB/s | fixed us per GEMV |")
    print("|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        gen = torch.Generator(device="cuda").manual_seed(0)
        rows = [("layer", *layer_chain(args.model, args.kind, variant, layers, gen), layers)]
        if not args.no_shapes:
            rows += [(name, *shape_chain(args.kind, variant, k, n, args.count, gen), args.count)
                     for name, (k, n) in shapes(args.model).items()]
        for name, ms, nbytes, count in rows:
            per = ms * 1000 / count
            tb_s = nbytes / (ms * 1e-3) / 1e12
            gemvs = 4 * count if name == "layer" else count
            fixed = (ms * 1000 - nbytes / (PEAK_TB_S * 1e12) * 1e6) / gemvs
            print(f"| {variant} | {name} | {per:.1f} | {nbytes / 1e9:.2f} | {tb_s:.2f} | {fixed:.2f} |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
