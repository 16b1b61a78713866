"""Compile every kernel for Hopper (sm_90) on any machine, GPU or not, and report its resources.

    python -m folio.kernels.compile_report [--arch 90] [--pdl] [--dump DIR]

Drives the real launchers at the W1 shapes of Qwen3-0.6B (with CPU tensors standing in for
device ones: only their dtypes, shapes and alignment matter) but compiles instead of launching,
then reads each cubin: registers, spills, shared memory, 16-byte global loads and tensor-core
instructions (HMMA / HGMMA). This is the "read what costs no device time" step: compile errors
the interpreter cannot see show up here, and so do spills and narrow loads.
With --pdl the kernels that take programmatic dependent launch compile as they launch on Hopper,
and the last column says where their griddepcontrol.wait sits: "wait" (before every global store
and atomic), "ld+wait" (a global load, the prefetch of weights, issued ahead of it) or "STORE"
(a store ahead of the wait: a race with the kernel before).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile for real; must precede every folio.kernels import

import argparse  # noqa: E402
import re  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from folio.kernels.sass_checks import cuobjdump, sass_of, wgmma_operand_races  # noqa: E402

HEADS, KV_HEADS, DIM, BLOCK = 16, 8, 128, 16


@dataclass
class Report:
    name: str
    case: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    wide_loads: int  # 16-byte global loads (LDG.E.128) or async copies (LDGSTS ... .128)
    narrow_loads: int  # other global loads
    mma: str  # HGMMA, QGMMA (FP8), HMMA or none
    pdl: str  # where griddepcontrol.wait sits: "-" (none), "wait", "ld+wait", "STORE"


def _compile_instead_of_launch(arch: int, results: list):
    """Patch JITFunction.run so a launch compiles for cuda:arch and records the kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)

    def run(self, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        source = ASTSource
        if getattr(self, "is_gluon", lambda: False)():  # a Gluon kernel: its own front end
            from triton.experimental.gluon._runtime import GluonASTSource as source
        kernel = compile(source(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        results.append((self.fn.__name__, kernel))

    JITFunction.run = run


def _allow_cpu_stand_ins() -> None:
    from folio.kernels import (
        activation,
        argmax,
        grammar_mask,
        gumbel_sample,
        lora_expand,
        lora_shrink,
        paged_attention,
        paged_decode,
        prefill_attention,
        reshape_and_cache,
        rms_norm,
        rotary,
    )

    from folio.kernels import fp8_gemm, fp8_gemm_triton, gemv, qk_norm_rope, w4a16_gemm

    modules = (activation, argmax, gumbel_sample, paged_attention, paged_decode, prefill_attention, reshape_and_cache,
               rms_norm, rotary, lora_shrink, lora_expand, grammar_mask, qk_norm_rope, w4a16_gemm, gemv,
               fp8_gemm, fp8_gemm_triton)
    for module in modules:
        module.check_same_device = lambda *_a, **_k: torch.device("cpu")
    from folio.kernels import prefill_attention_hopper

    if prefill_attention_hopper.HAS_GLUON:  # a Hopper kernel: CPU stand-ins take it as they would on an H100
        prefill_attention_hopper.check_same_device = lambda *_a, **_k: torch.device("cpu")
        prefill_attention_hopper.supports = lambda *_a, **_k: True


def _launch_with_pdl() -> None:
    """Launchers pass PDL as they would on a Hopper GPU (CPU stand-ins otherwise turn it off)."""
    from folio.kernels import (activation, fp8_gemm, fp8_gemm_triton, gemv, paged_decode, qk_norm_rope, rms_norm,
                               split_k_sum, w4a16_gemm)

    for module in (activation, paged_decode, qk_norm_rope, rms_norm, w4a16_gemm, gemv, fp8_gemm, fp8_gemm_triton,
                   split_k_sum):
        module.pdl_launch = lambda _x: {"PDL": True, "launch_pdl": True}


def _launch_all(dtype: torch.dtype, sweep: bool = False) -> list[str]:
    """Call each launcher once per case of interest; returns the case labels in launch order."""
    from folio.kernels.activation import silu_and_mul_triton
    from folio.kernels.grammar_mask import apply_token_bitmask_triton
    from folio.kernels.paged_attention import unified_attention
    from folio.kernels.paged_decode import paged_decode
    from folio.kernels.reshape_and_cache import reshape_and_cache
    from folio.kernels.rms_norm import rms_norm_triton
    from folio.kernels.rotary import rotary_triton

    t, seqs, blocks = 256, 8, 64
    q = torch.zeros(t, HEADS, DIM, dtype=dtype)
    kv = torch.zeros(2, blocks, BLOCK, KV_HEADS, DIM, dtype=dtype)
    qsl, lens = torch.arange(seqs + 1, dtype=torch.int32), torch.full((seqs,), 100, dtype=torch.int32)
    tables = torch.zeros(seqs, 8, dtype=torch.int32)
    cases = []
    reshape_and_cache(torch.zeros(t, KV_HEADS, DIM, dtype=dtype), torch.zeros(t, KV_HEADS, DIM, dtype=dtype),
                      kv, torch.zeros(t, dtype=torch.int64))
    cases.append("cache write")
    for max_q in (1, 512):
        unified_attention(q, kv, qsl, lens, tables, seqs, max_q, 0.1)
        cases.append(f"unified max_query_len={max_q}")
    paged_decode(q, kv, qsl, lens, tables, seqs, 0.1, num_splits=1)
    cases.append("decode no split")
    paged_decode(q, kv, qsl, lens, tables, seqs, 0.1, num_splits=8)
    cases += ["decode 8 splits", "merge 8 splits"]
    x = torch.zeros(t, 1024, dtype=dtype)
    rms_norm_triton(x, torch.zeros(1024, dtype=dtype), 1e-6, x.clone())
    cases.append("hidden 1024 + residual")
    rms_norm_triton(q, torch.zeros(DIM, dtype=dtype), 1e-6)
    cases.append("per-head 128")
    qkv = torch.zeros(t, (HEADS + 2 * KV_HEADS) * DIM, dtype=dtype)
    rotary_triton(qkv[:, : HEADS * DIM], qkv[:, HEADS * DIM : (HEADS + KV_HEADS) * DIM],
                  torch.zeros(t, dtype=torch.int64), torch.zeros(4096, DIM, dtype=dtype), DIM)
    cases.append("16 q + 8 k heads")
    silu_and_mul_triton(torch.zeros(t, 2 * 3072, dtype=dtype))
    cases.append("inter 3072")
    cases += _launch_decode_extras(dtype, q, kv, t)
    from folio.kernels.gumbel_sample import gumbel_sample

    gumbel_sample(torch.zeros(256, 151936), torch.zeros(256, dtype=torch.int64), torch.ones(256), num_sms=132)
    cases.append("256 x 151936, temperature")
    from folio.kernels.argmax import argmax_split

    argmax_split(torch.zeros(1, 151936), num_sms=132)
    cases += ["greedy 1 x 151936, 64 splits", "merge 64 splits"]
    if dtype != torch.float32:
        from folio.kernels.benchmark import PREFILL_SWEEP, _short
        from folio.kernels.prefill_attention import prefill_attention

        for config in [None, *(PREFILL_SWEEP if sweep else [])]:
            prefill_attention(q, kv, qsl, lens, tables, seqs, 0.1, config=config)
            cases.append(f"prefill {_short(config) or 'default'}")
        from folio.kernels import prefill_attention_hopper

        if prefill_attention_hopper.HAS_GLUON:
            prefill_attention_hopper.hopper_prefill_attention(q, kv, qsl, lens, tables, seqs, 0.1)
            cases.append("prefill Gluon")
    vocab = 151936  # structured outputs: the grammar mask works on float32 logits whatever the dtype
    apply_token_bitmask_triton(torch.zeros(t, vocab), torch.zeros(t, (vocab + 31) // 32, dtype=torch.int32),
                               torch.arange(t))
    cases.append("grammar mask vocab 151936")
    return cases + _launch_lora(dtype)


def _launch_gluon_shapes(dtype: torch.dtype) -> list[str]:
    """The Gluon prefill at every shape `supports` admits (--gluon-shapes). ptxas allocates
    registers per compilation and serializes every wgmma of the kernel when one partition runs
    short (session 19), so each shape is checked for serialized wgmma, spills, its shared memory,
    and a write to a running wgmma's register operand (P, the A operand of P V, sits in registers)."""
    from folio.kernels import prefill_attention_hopper as hopper

    qsl, lens = torch.arange(9, dtype=torch.int32), torch.full((8,), 100, dtype=torch.int32)
    tables = torch.zeros(8, 8, dtype=torch.int32)
    cases = []
    for group in hopper.ADMITTED_GROUPS:
        for block in hopper.ADMITTED_BLOCKS:
            q = torch.zeros(256, 8 * group, DIM, dtype=dtype)
            kv = torch.zeros(2, 64, block, 8, DIM, dtype=dtype)
            hopper.hopper_prefill_attention(q, kv, qsl, lens, tables, 8, 0.1)
            cases.append(f"Gluon GQA {group}, block {block}")
    return cases


def _launch_decode_extras(dtype: torch.dtype, q: torch.Tensor, kv: torch.Tensor, t: int) -> list[str]:
    """Qwen3's fused q/k norm + rotary + cache write, and the one-token W4A16 and 16-bit GEMVs
    (Llama-3.1-8B's QKV shape) where the dtype is a 16-bit one."""
    from folio.kernels.qk_norm_rope import KVWrite, qk_norm_rope_triton

    qkv = torch.zeros(t, (HEADS + 2 * KV_HEADS) * DIM, dtype=dtype)
    q_part, k_part = qkv[:, : HEADS * DIM], qkv[:, HEADS * DIM : (HEADS + KV_HEADS) * DIM]
    write = KVWrite(qkv[:, (HEADS + KV_HEADS) * DIM :], kv, torch.zeros(t, dtype=torch.int64))
    qk_norm_rope_triton(q_part, k_part, torch.zeros(t, dtype=torch.int64), torch.zeros(4096, DIM, dtype=dtype), DIM,
                        torch.zeros(DIM, dtype=dtype), torch.zeros(DIM, dtype=dtype), cache=write)
    cases = ["q/k norm + rotary + cache"]
    if dtype != torch.float32:
        from folio.kernels.w4a16_gemm import w4a16_gemm_triton

        k, n = 4096, 6144
        w4a16_gemm_triton(torch.zeros(1, k, dtype=dtype), torch.zeros(k // 8, n, dtype=torch.int32),
                          torch.zeros(k // 128, n), None, 128)
        cases += ["w4a16 M=1 4096x6144", "its 32 splits' sum"]
        from folio.kernels.gemv import gemv

        gemv(torch.zeros(1, k, dtype=dtype), torch.zeros(n, k, dtype=dtype), torch.zeros(n, dtype=dtype), split_k=2)
        cases += ["gemv 4096x6144 + bias", "its 2 splits' sum + bias"]
        from folio.kernels.fp8_gemm import quantize_per_token_triton
        from folio.kernels.fp8_gemm_triton import fp8_gemm_triton

        for width in (4096, 14336):  # one pass (the row in registers), two passes
            quantize_per_token_triton(torch.zeros(16, width, dtype=dtype))
            cases.append(f"fp8 quantize 16 x {width}")
        from folio.kernels.rms_norm import rms_norm_triton

        rms_norm_triton(torch.zeros(16, 4096, dtype=dtype), torch.zeros(4096, dtype=dtype), 1e-6,
                        torch.zeros(16, 4096, dtype=dtype), fp8_out=True)
        cases.append("hidden 4096 + residual -> fp8")
        from folio.kernels.activation import silu_and_mul_fp8

        for inter in (3072, 14336):  # Qwen3-0.6B's and Llama-3.1-8B's MLP widths
            silu_and_mul_fp8(torch.zeros(16, 2 * inter, dtype=dtype))
            cases.append(f"inter {inter} -> fp8")
        fp8 = torch.float8_e4m3fn
        fp8_gemm_triton(torch.zeros(16, k, dtype=fp8), torch.ones(16, 1), torch.zeros(n, k, dtype=fp8),
                        torch.ones(n), None, dtype)  # split K: partials, then the sum kernel
        cases += ["fp8 gemm M=16 4096x6144", "fp8 sum splits M=16"]
        n = 28672  # one split: the scales and the bias in the GEMM's epilogue
        fp8_gemm_triton(torch.zeros(256, k, dtype=fp8), torch.ones(256, 1), torch.zeros(n, k, dtype=fp8),
                        torch.ones(n), torch.zeros(n, dtype=dtype), dtype)
        cases.append("fp8 gemm M=256 4096x28672 + bias")
    return cases


def _launch_lora(dtype: torch.dtype) -> list[str]:
    """LoRA shrink / expand at Llama-3.1-8B's QKV shapes, rank 16, 8 slots: decode and prefill."""
    from folio.kernels.lora_expand import lora_expand_triton
    from folio.kernels.lora_shrink import LoRABlocks, lora_shrink_triton, num_blocks

    slots, rank, hidden, shards = 8, 16, 4096, [4096, 1024, 1024]
    cases = []
    for t in (256, 2048):
        i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
        blocks = LoRABlocks(*(i32(num_blocks(t, slots)) for _ in range(3)))
        a = torch.zeros(slots, 3 * rank, hidden, dtype=dtype)
        # as the engine runs them: the expand adds the shrink's kept split-K partials (8 at decode)
        shrunk = lora_shrink_triton(torch.zeros(t, hidden, dtype=dtype), a, i32(t), blocks, keep_splits=True)
        b = torch.zeros(slots, sum(shards), rank, dtype=dtype)
        lora_expand_triton(torch.zeros(t, sum(shards), dtype=dtype), shrunk, b, i32(4), i32(t), blocks, shards)
        cases += [f"lora shrink {t} tokens", f"lora expand {t} tokens"]
    return cases


def _inspect(name: str, case: str, kernel, dump: str | None) -> Report:
    res = cuobjdump(kernel.asm["cubin"], "-res-usage")
    sass = sass_of(kernel.asm["cubin"])
    if dump:
        os.makedirs(dump, exist_ok=True)
        stem = os.path.join(dump, f"{name}.{re.sub(r'[^A-Za-z0-9]+', '_', case)}")
        for ext, text in (("ptx", kernel.asm["ptx"]), ("sass", sass), ("ttgir", kernel.asm["ttgir"])):
            with open(f"{stem}.{ext}", "w") as f:
                f.write(text)
    regs = int(m.group(1)) if (m := re.search(r"REG:(\d+)", res)) else -1
    stack = int(m.group(1)) if (m := re.search(r"STACK:(\d+)", res)) else 0
    loads = re.findall(r"\b(LDG\S*|LDGSTS\S*)", sass)
    wide = sum(".128" in op for op in loads)
    mma = next((op for op in ("HGMMA", "QGMMA", "HMMA") if op in sass), "none")  # QGMMA: FP8 wgmma
    if mma in ("HGMMA", "QGMMA") and sass.count("WARPGROUP.DEPBAR") >= len(re.findall(r"\b[HQ]GMMA\.", sass)):
        mma += "-serial"  # ptxas waits on every wgmma (its C7514 note): no overlap with anything
    if wgmma_operand_races(sass):
        mma += "-race"  # a register operand of an async wgmma overwritten before the wait retires it
    return Report(name, case, regs, stack, kernel.metadata.shared, wide, len(loads) - wide, mma, _pdl_order(sass))


def _pdl_order(sass: str) -> str:
    """Where griddepcontrol.wait (SASS ACQBULK) sits among the global memory instructions."""
    before, wait, _ = sass.partition("ACQBULK")
    if not wait:
        return "-"
    if re.search(r"\b(STG|ST\.E|ATOMG|ATOM\.E|RED\.E)", before):
        return "STORE"
    return "ld+wait" if re.search(r"\bLDG", before) else "wait"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--sweep", action="store_true", help="also the prefill kernel's swept tile configs")
    parser.add_argument("--dump", default=None, help="write PTX, SASS and TTGIR of every kernel here")
    parser.add_argument("--pdl", action="store_true", help="compile with programmatic dependent launch")
    parser.add_argument("--gluon-shapes", action="store_true",
                        help="only the Gluon prefill, at every shape it admits (races on P, serialized wgmma)")
    args = parser.parse_args()
    results: list = []
    _compile_instead_of_launch(args.arch, results)
    _allow_cpu_stand_ins()
    if args.pdl:
        _launch_with_pdl()
    dtype = getattr(torch, args.dtype)
    cases = _launch_gluon_shapes(dtype) if args.gluon_shapes else _launch_all(dtype, args.sweep)
    reports = [_inspect(name, case, k, args.dump) for (name, k), case in zip(results, cases)]
    print(f"sm_{args.arch}, {args.dtype}")
    print(f"{'kernel':<28} {'case':<26} {'regs':>5} {'stack':>6} {'smem':>7} {'ld128':>6} {'ld<128':>7} {'mma':>6} "
          f"{'pdl':>8}")
    for r in reports:
        print(f"{r.name:<28} {r.case:<26} {r.registers:>5} {r.spill_bytes:>6} {r.shared_bytes:>7} "
              f"{r.wide_loads:>6} {r.narrow_loads:>7} {r.mma:>6} {r.pdl:>8}")


if __name__ == "__main__":
    main()
