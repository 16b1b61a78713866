"""Check, then time every kernel at the W1 shapes of Qwen3-0.6B; print fractions of the floor.

    python -m folio.kernels.benchmark [--sweep] [--out DIR]     # on a GPU
    python -m folio.kernels.benchmark --tiny                    # CPU smoke run (interpreter)
    python -m folio.kernels.benchmark --only quant --sweep      # W4A16 / FP8 GEMMs (benchmark_quant.py)
    python -m folio.kernels.benchmark --only fp8 --sweep        # FP8 GEMM: cuBLASLt vs Triton by M

First measures the two ceilings on this device (a 1 GiB device copy, bytes read + written; a
bf16 8192^3 matmul), then for each case: checks the kernel against its torch reference on fresh
random inputs, times it (median of triton.testing.do_bench, and through a CUDA graph, which
removes launch gaps), and reports bytes and FLOPs over the measured ceilings. Results go to
DIR/kernel_bench.json (DIR defaults to $OUT, else the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from folio.attention.backends.torch_ref import paged_attention_reference
from folio.kernels import activation, prefill_attention_hopper, rms_norm, rotary
from folio.kernels.paged_attention import TileConfig, unified_attention
from folio.kernels.paged_decode import choose_num_splits, paged_decode
from folio.kernels.prefill_attention import prefill_attention
from folio.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_reference

HEADS, KV_HEADS, DIM, BLOCK, HIDDEN, INTER = 16, 8, 128, 16, 1024, 3072  # Qwen3-0.6B


@dataclass
class Row:
    case: str
    median_us: float
    graph_us: float | None
    bytes: int
    flops: int
    tb_s: float
    frac_copy: float  # of the measured device copy bandwidth
    frac_mma: float  # of the measured bf16 matmul rate
    max_err: float


def _time(fn: Callable[[], object], device: torch.device) -> tuple[float, float | None]:
    """(median ms through events, median ms per replay of a CUDA graph) or host time on the CPU."""
    if device.type != "cuda":
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3, None
    import triton.testing

    median = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    try:
        graph = triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
    except Exception:  # some launchers allocate; graph timing is a bonus
        graph = None
    return median, graph


def measure_ceilings(device: torch.device) -> tuple[float, float]:
    """(copy bytes/s, bf16 matmul FLOP/s) measured here."""
    if device.type != "cuda":
        return 3.0e12, 785e12  # the H100 figures from DESIGN.md, for the smoke run
    src = torch.empty(1 << 29, dtype=torch.float16, device=device).normal_()  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms, _ = _time(lambda: dst.copy_(src), device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    mm_ms, _ = _time(lambda: a @ b, device)
    return 2 * src.numel() * 2 / (copy_ms * 1e-3), 2 * 8192**3 / (mm_ms * 1e-3)


def _row(case, fn, check, nbytes, flops, device, ceilings) -> Row | None:
    try:
        err = float(check())
    except Exception as e:  # e.g. a swept tile config needing more shared memory than there is
        print(f"skipped {case}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return None
    median, graph = _time(fn, device)
    best = min(median, graph) if graph is not None else median
    tb_s = nbytes / (best * 1e-3) / 1e12
    return Row(case, median * 1e3, graph * 1e3 if graph else None, nbytes, flops, tb_s,
               nbytes / (best * 1e-3) / ceilings[0], flops / (best * 1e-3) / ceilings[1], err)


def _paged(seq_lens, q_lens, device, dtype, gen):
    # A developer tool run from the repository root: it shares the tests' paged-batch builder.
    from tests.kernels.paged_batch import make_paged_batch

    return make_paged_batch(q_lens, seq_lens, HEADS, KV_HEADS, DIM, BLOCK, dtype=dtype, device=device,
                            seed=int(torch.randint(1 << 30, (1,), generator=gen)))


def _attention_cost(batch, itemsize) -> tuple[int, int]:
    """Fewest bytes (each context K/V read once, q read, out written) and FLOPs (QK and PV)."""
    md = batch.metadata
    kv = sum(md.seq_lens_cpu) * KV_HEADS * DIM * 2 * itemsize
    qo = 2 * md.num_actual_tokens * HEADS * DIM * itemsize
    pairs = sum(
        sum(s - q + j + 1 for j in range(q)) for q, s in
        ((md.query_len(i), md.seq_lens_cpu[i]) for i in range(md.num_seqs))
    )
    return kv + qo, 4 * pairs * HEADS * DIM


def decode_cases(device, dtype, ceilings, gen, tiny, sweep) -> list[Row]:
    rows = []
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    shapes = [(4, 40, 80)] if tiny else [(256, 100, 2048), (64, 500, 2048), (8, 1500, 2048), (1, 2000, 2048)]
    for num_seqs, lo, hi in shapes:
        seq_lens = torch.randint(lo, hi, (num_seqs,), generator=gen).tolist()
        batch = _paged(seq_lens, [1] * num_seqs, device, dtype, gen)
        md = batch.metadata
        nbytes, flops = _attention_cost(batch, batch.query.element_size())
        expected = paged_attention_reference(batch.query, batch.kv_cache, md, DIM**-0.5)
        heuristic = choose_num_splits(num_seqs, KV_HEADS, sms)
        configs = [None]
        if sweep and not os.environ.get("FOLIO_BENCH_FP8_ONLY"):
            configs += [TileConfig(16, t, w, s) for t in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]
        for splits in sorted({1, heuristic}):
            for config in configs:
                out = torch.full_like(batch.query, float("nan"))

                def run(splits=splits, config=config, out=out):
                    return paged_decode(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                                        md.block_tables, num_seqs, DIM**-0.5, num_splits=splits, out=out,
                                        config=config)

                def check(run=run, out=out):
                    run()
                    return (out.float() - expected.float()).abs().max()

                name = f"decode seqs={num_seqs} ctx={lo}-{hi} splits={splits} {config or 'default'}"
                rows.append(_row(name, run, check, nbytes, flops, device, ceilings))
        if dtype != torch.float32:
            fp8_configs = [None]
            if sweep:
                fp8_configs += [TileConfig(16, t, w, st) for t in (64, 128) for w in (4, 8) for st in (2, 3, 4)]
            rows += _fp8_cache_decode_rows(batch, num_seqs, lo, hi, heuristic, device, ceilings, fp8_configs)
    return rows


def _fp8_cache_decode_rows(batch, num_seqs, lo, hi, splits, device, ceilings, configs) -> list[Row]:
    """The same decode step over an FP8 (e4m3) cache, once per tile config: half the K/V bytes,
    widened in the kernel (`--kv-cache-dtype fp8`); checked against the reference over the same
    e4m3 values (the cache converted and the reference run once for all configs)."""
    md = batch.metadata
    kv8 = batch.kv_cache.to(torch.float8_e4m3fn)
    expected = paged_attention_reference(batch.query, kv8.to(batch.query.dtype), md, DIM**-0.5)
    kv_bytes = sum(md.seq_lens_cpu) * KV_HEADS * DIM * 2
    nbytes = kv_bytes + 2 * md.num_actual_tokens * HEADS * DIM * batch.query.element_size()
    rows = []
    for config in configs:
        out = torch.full_like(batch.query, float("nan"))

        def run(config=config, out=out):
            return paged_decode(batch.query, kv8, md.query_start_loc, md.seq_lens, md.block_tables, num_seqs,
                                DIM**-0.5, num_splits=splits, out=out, config=config)

        def check(run=run, out=out):
            run()
            return (out.float() - expected.float()).abs().max()

        name = f"decode seqs={num_seqs} ctx={lo}-{hi} splits={splits} fp8 cache {config or 'default'}"
        rows.append(_row(name, run, check, nbytes, 0, device, ceilings))
    return rows


def unified_cases(device, dtype, ceilings, gen, tiny, sweep) -> list[Row]:
    rows = []
    if tiny:
        shapes = [("mixed", [30, 1, 1], [50, 40, 9])]
    else:
        decodes = torch.randint(100, 2048, (200,), generator=gen).tolist()
        shapes = [
            ("prefill 8x1024", [1024] * 8, [1024] * 8),
            ("chunk 2048 on ctx 2048 + 200 decodes", [2048] + [1] * 200, [4096] + decodes),
        ]
    for name, q_lens, seq_lens in shapes:
        batch = _paged(seq_lens, q_lens, device, dtype, gen)
        md = batch.metadata
        nbytes, flops = _attention_cost(batch, batch.query.element_size())
        expected = paged_attention_reference(batch.query, batch.kv_cache, md, DIM**-0.5)
        configs = [None]
        if sweep:
            configs += [TileConfig(m, n, w, s) for m in (16, 64, 128) for n in (32, 64) for w in (4, 8) for s in (2, 3)]
        for config in configs:
            out = torch.full_like(batch.query, float("nan"))

            def run(config=config, out=out):
                return unified_attention(batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens,
                                         md.block_tables, md.num_seqs, md.max_query_len, DIM**-0.5,
                                         out=out, config=config)

            def check(run=run, out=out):
                run()
                return (out.float() - expected.float()).abs().max()

            rows.append(_row(f"unified {name} {config or 'default'}", run, check, nbytes, flops, device, ceilings))
    return rows


PREFILL_SWEEP = [TileConfig(m, n, w, s) for m, n, w, s in (
    (128, 64, 8, 2), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 8, 3), (256, 64, 8, 2),
    (128, 128, 8, 3), (64, 128, 4, 2))]


def _short(config: TileConfig | None) -> str:
    if config is None:
        return ""
    return f"m{config.block_m} n{config.tile_n} w{config.num_warps} s{config.num_stages}"


def prefill_cases(device, dtype, ceilings, gen, tiny, sweep) -> list[Row]:
    """The prefill kernel against the unified kernel on long chunks (the chunks of an 8k and a
    32k prompt at 8,192 tokens per step) and on W1's mixed step. The longest cases are checked
    against the unified kernel (tested against the reference) to spare the reference's memory."""
    rows = []
    if tiny:
        shapes = [("chunk 40 on ctx 30", [40], [70])]
    else:
        decodes = torch.randint(100, 2048, (200,), generator=gen).tolist()
        shapes = [
            ("prefill 8x1024", [1024] * 8, [1024] * 8),
            ("chunk 8192 on ctx 0", [8192], [8192]),
            ("chunk 8192 on ctx 8192", [8192], [16384]),
            ("chunk 8192 on ctx 24576", [8192], [32768]),
            ("chunk 2048 on ctx 2048 + 200 decodes", [2048] + [1] * 200, [4096] + decodes),
        ]
    for name, q_lens, seq_lens in shapes:
        batch = _paged(seq_lens, q_lens, device, dtype, gen)
        md = batch.metadata
        nbytes, flops = _attention_cost(batch, batch.query.element_size())
        common = (batch.query, batch.kv_cache, md.query_start_loc, md.seq_lens, md.block_tables, md.num_seqs)
        if max(seq_lens) > 16384:
            expected = unified_attention(*common, md.max_query_len, DIM**-0.5)
        else:
            expected = paged_attention_reference(batch.query, batch.kv_cache, md, DIM**-0.5)
        variants = [("unified default", None)] + [("prefill default", None)]
        if prefill_attention_hopper.supports(batch.query, batch.kv_cache, None):
            variants += [("prefill gluon ping-pong", True), ("prefill gluon free-running", False)]
        if sweep:
            variants += [("prefill", c) for c in PREFILL_SWEEP]
        for label, config in variants:
            out = torch.full_like(batch.query, float("nan"))

            def run(label=label, config=config, out=out):
                if label.startswith("unified"):
                    return unified_attention(*common, md.max_query_len, DIM**-0.5, out=out)
                if label.startswith("prefill gluon"):
                    return prefill_attention_hopper.hopper_prefill_attention(*common, DIM**-0.5, out=out,
                                                                             pingpong=config)
                return prefill_attention(*common, DIM**-0.5, out=out, config=config)

            def check(run=run, out=out, expected=expected):
                run()
                return (out.float() - expected.float()).abs().max()

            tiles = _short(config) if isinstance(config, TileConfig) else ""
            rows.append(_row(f"{name}: {label} {tiles}", run, check, nbytes, flops, device, ceilings))
        del batch, expected
    return rows


def sampling_cases(device, ceilings, tiny) -> list[Row]:
    """One decode step's draw at temperature 0.6 (W1 at nano-vllm's setting): the torch race
    (softmax, exponential noise, divide, argmax) against the fused Gumbel-max kernel. Floor: the
    float32 logits read once. The check is the fraction of rows where the two pick the same token
    under temperature 1e-4 (both must be the argmax), reported as 1 - that."""
    from folio.sample import Sampler, SamplingMetadata
    from folio.sample.metadata import SamplingRow
    from folio.sampling_params import SamplingParams

    rows = []
    vocab = 1000 if tiny else 151936
    for batch in ([3] if tiny else [1, 64, 256]):
        logits = torch.randn(batch, vocab, device=device) * 3
        for temperature in (0.6, 1e-4):
            params = SamplingParams(temperature=temperature, max_tokens=4)
            meta = SamplingMetadata.build([SamplingRow(params, [1], [], None, 0)] * batch, vocab, device)
            for fused in (False, True):
                sampler = Sampler(0, device, fused=fused)

                def run(sampler=sampler, meta=meta):
                    return sampler(logits, meta).sampled_token_ids

                def check(run=run):
                    return (run() != logits.argmax(dim=1)).float().mean() if temperature < 0.01 else 0.0

                name = f"sample T={temperature} rows={batch} {'fused' if fused else 'torch'}"
                rows.append(_row(name, run, check, logits.numel() * 4, 0, device, ceilings))
    return rows


def elementwise_cases(device, dtype, ceilings, tiny) -> list[Row]:
    rows = []
    for tokens in ([5] if tiny else [256, 8192]):
        item = torch.empty((), dtype=dtype).element_size()
        hidden, inter = (64, 96) if tiny else (HIDDEN, INTER)
        x = torch.randn(tokens, hidden, device=device, dtype=dtype)
        res = torch.randn_like(x)
        w = torch.randn(hidden, device=device, dtype=dtype)
        rows.append(_row(f"rms_norm+residual T={tokens}", lambda: rms_norm.rms_norm_triton(x, w, 1e-6, res),
                         lambda: (rms_norm.rms_norm_triton(x, w, 1e-6, res)[0].float()
                                  - rms_norm.rms_norm_reference(x, w, 1e-6, res)[0].float()).abs().max(),
                         4 * x.numel() * item, 0, device, ceilings))
        g = torch.randn(tokens, 2 * inter, device=device, dtype=dtype)
        rows.append(_row(f"silu_and_mul T={tokens}", lambda: activation.silu_and_mul_triton(g),
                         lambda: (activation.silu_and_mul_triton(g).float()
                                  - activation.silu_and_mul_reference(g).float()).abs().max(),
                         3 * tokens * inter * item, 0, device, ceilings))
        qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * DIM, device=device, dtype=dtype)
        q, k = qkv[:, : HEADS * DIM], qkv[:, HEADS * DIM : (HEADS + KV_HEADS) * DIM]
        pos = torch.randint(0, 4096, (tokens,), device=device)
        cache = torch.randn(4096, DIM, device=device, dtype=dtype)

        def check_rotary(qkv=qkv, pos=pos, cache=cache):
            mine, ref = qkv.clone(), qkv.clone()
            cut = (HEADS * DIM, (HEADS + KV_HEADS) * DIM)
            rotary.rotary_triton(mine[:, : cut[0]], mine[:, cut[0] : cut[1]], pos, cache, DIM)
            rotary.rotary_reference(ref[:, : cut[0]], ref[:, cut[0] : cut[1]], pos, cache, DIM)
            return (mine.float() - ref.float()).abs().max()

        rows.append(_row(f"rotary T={tokens}", lambda: rotary.rotary_triton(q, k, pos, cache, DIM), check_rotary,
                         2 * (q.numel() + k.numel()) * item, 0, device, ceilings))
        kv = torch.randn(2, tokens // BLOCK + 2, BLOCK, KV_HEADS, DIM, device=device, dtype=dtype)
        key = torch.randn(tokens, KV_HEADS, DIM, device=device, dtype=dtype)
        val = torch.randn_like(key)
        slots = torch.randperm(kv.shape[1] * BLOCK, device=device)[:tokens]

        def check_cache():
            ref = kv.clone()
            reshape_and_cache(key, val, kv, slots)
            reshape_and_cache_reference(key, val, ref, slots)
            return (kv.float() - ref.float()).abs().max()

        rows.append(_row(f"reshape_and_cache T={tokens}", lambda: reshape_and_cache(key, val, kv, slots),
                         check_cache, 4 * key.numel() * item, 0, device, ceilings))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU interpreter smoke run)")
    parser.add_argument("--sweep", action="store_true", help="also time alternative tile configs")
    parser.add_argument("--only", choices=["prefill", "sampling", "quant", "fp8", "decode"],
                        help="run only these cases (and the ceilings)")
    parser.add_argument("--tokens", type=int, nargs="+", help="quant: only these token counts (M)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    ceilings = measure_ceilings(device)
    rows = []
    if args.only is None:
        rows += elementwise_cases(device, dtype, ceilings, args.tiny)
        rows += decode_cases(device, dtype, ceilings, gen, args.tiny, args.sweep)
        rows += unified_cases(device, dtype, ceilings, gen, args.tiny, args.sweep)
    if args.only == "decode":
        rows += decode_cases(device, dtype, ceilings, gen, args.tiny, args.sweep)
    if args.only in (None, "sampling"):
        rows += sampling_cases(device, ceilings, args.tiny)
    if args.only in (None, "prefill") and dtype != torch.float32:
        rows += prefill_cases(device, dtype, ceilings, gen, args.tiny, args.sweep)
    if args.only == "quant":  # W4A16 / FP8 at Llama-3.1-8B's shapes (kernels/benchmark_quant.py)
        from folio.kernels.benchmark_quant import quant_cases

        rows += quant_cases(device, dtype, ceilings, args.tiny, args.sweep, _row, args.tokens)
    if args.only == "fp8":  # the FP8 GEMM alone: cuBLASLt against the Triton kernel, by token count
        from folio.kernels.benchmark_quant import fp8_gemm_cases

        rows += fp8_gemm_cases(device, dtype, ceilings, args.tiny, args.sweep, _row)
    rows = [r for r in rows if r is not None]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_bench.json"), "w") as f:
        json.dump({"device": str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
                   "copy_tb_s": ceilings[0] / 1e12, "mma_tflop_s": ceilings[1] / 1e12,
                   "rows": [asdict(r) for r in rows]}, f, indent=1)
    print(f"ceilings: copy {ceilings[0] / 1e12:.2f} TB/s, bf16 matmul {ceilings[1] / 1e12:.0f} TFLOP/s")
    print(f"{'case':<78} {'us':>9} {'graph us':>9} {'TB/s':>6} {'%copy':>6} {'%mma':>6} {'err':>8}")
    for r in rows:
        graph = f"{r.graph_us:9.1f}" if r.graph_us is not None else f"{'-':>9}"
        print(f"{r.case[:78]:<78} {r.median_us:9.1f} {graph} {r.tb_s:6.2f} {100 * r.frac_copy:6.1f} "
              f"{100 * r.frac_mma:6.1f} {r.max_err:8.1e}")
    if rows:
        print(f"median of medians: {statistics.median(r.median_us for r in rows):.1f} us")


if __name__ == "__main__":
    main()
