"""Every kernel compiles for Hopper (sm_90) without spilling: checked on any machine, GPU or not.

The interpreter runs the kernels' Python, not the compiler, so type errors in loops, unsupported
ops and register spills only show here (folio/kernels/compile_report.py, in a fresh process
because the interpreter is chosen when kernels are decorated).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[2]


def _report(*args: str) -> list[list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "folio.kernels.compile_report", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line.split() for line in proc.stdout.splitlines() if line.startswith("_")]


def _child_prints(code: str) -> list[str]:
    """The words `code` prints in a child process (importing compile_report turns the interpreter
    off for later imports, so the check cannot run in this one)."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_every_kernel_compiles_for_sm90_without_spills():
    rows = _report()
    kernels = {row[0] for row in rows}
    assert kernels == {
        "_reshape_and_cache_kernel", "_unified_attention_kernel", "_paged_decode_kernel",
        "_merge_splits_kernel", "_rms_norm_kernel", "_rotary_kernel", "_silu_and_mul_kernel",
        "_lora_shrink_kernel", "_lora_expand_kernel",
        "_prefill_attention_kernel", "_hopper_prefill_kernel", "_gumbel_sample_kernel",
        "_apply_bitmask_kernel", "_qk_norm_rope_kernel", "_w4a16_gemv_kernel", "_gemv_kernel",
        "_fp8_gemm_kernel", "_fp8_sum_splits_kernel", "_quantize_per_token_kernel",
        "_silu_and_mul_fp8_kernel", "_sum_partials_kernel", "_argmax_split_kernel", "_argmax_merge_kernel",
    }
    for row in rows:
        regs, stack = int(row[-7]), int(row[-6])
        assert regs > 0 and stack == 0, f"{row[0]} spills or failed to assemble: {' '.join(row)}"
        assert row[-1] == "-", f"{row[0]}: griddepcontrol.wait compiled in without --pdl"
    prefill = [row for row in rows if row[0] == "_unified_attention_kernel" and "max_query_len=512" in " ".join(row)]
    assert prefill and prefill[0][-2] == "HGMMA", "prefill tiles should use Hopper's wgmma"
    prefill_kernel = [row for row in rows if row[0] in ("_prefill_attention_kernel", "_hopper_prefill_kernel")]
    assert len(prefill_kernel) == 2 and all(row[-2] == "HGMMA" for row in prefill_kernel), "wgmma serialized?"
    fp8 = [row for row in rows if row[0] == "_fp8_gemm_kernel"]
    assert fp8 and all(row[-2] == "QGMMA" for row in fp8), "the FP8 GEMM should use Hopper's FP8 wgmma"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_gluon_prefill_pipelines_at_every_shape_it_admits(dtype):
    """Every (query heads a KV head, block size) `supports` lets in, compiled for sm_90: no spill,
    no serialized wgmma (ptxas serializes all of a kernel's wgmma when one partition is short of
    registers), no write to a register operand of a running wgmma (session 18's NaN), and the
    shared memory the launch budgets for (`_smem_bytes`) covers what the kernel allocates."""
    from folio.kernels.prefill_attention_hopper import (ADMITTED_BLOCKS, ADMITTED_GROUPS, HAS_GLUON, SMEM_BYTES,
                                                        _smem_bytes)

    if not HAS_GLUON:
        pytest.skip("needs Triton's Gluon")
    rows = _report("--gluon-shapes", "--dtype", dtype)
    assert len(rows) == len(ADMITTED_GROUPS) * len(ADMITTED_BLOCKS)
    for row in rows:
        regs, stack, smem = int(row[-7]), int(row[-6]), int(row[-5])
        assert regs > 0 and stack == 0 and row[-2] == "HGMMA", " ".join(row)
        assert _smem_bytes(128, 2) <= smem <= min(_smem_bytes(128, 2) + 1_024, SMEM_BYTES), " ".join(row)


# The kernels of a decode step that take programmatic dependent launch on Hopper.
PDL_KERNELS = {"_paged_decode_kernel", "_merge_splits_kernel", "_rms_norm_kernel", "_silu_and_mul_kernel",
               "_qk_norm_rope_kernel", "_w4a16_gemv_kernel", "_gemv_kernel", "_fp8_gemm_kernel", "_fp8_sum_splits_kernel",
               "_quantize_per_token_kernel", "_silu_and_mul_fp8_kernel", "_sum_partials_kernel"}


def test_pdl_kernels_wait_before_any_store_and_the_gemv_loads_weights_first():
    """Under programmatic dependent launch a kernel starts while the one before it still runs:
    it must not store (or read what that kernel writes) before griddepcontrol.wait. The SASS
    order is the check; the GEMVs issue their first weight loads ahead of the wait (the point of
    PDL for them), the others at most read weights there."""
    rows = _report("--pdl")
    for row in rows:
        regs, stack = int(row[-7]), int(row[-6])
        assert regs > 0 and stack == 0, f"{row[0]} spills with PDL: {' '.join(row)}"
        if row[0] in PDL_KERNELS:
            assert row[-1] in ("wait", "ld+wait"), f"{row[0]}: {row[-1]} ({' '.join(row)})"
        else:
            assert row[-1] == "-", f"{row[0]} has a wait but is not launched with PDL"
    assert {row[0] for row in rows if row[-1] != "-"} == PDL_KERNELS
    assert [row[-1] for row in rows if row[0] in ("_w4a16_gemv_kernel", "_gemv_kernel")] == ["ld+wait", "ld+wait"]


def test_pdl_order_reads_the_sass():
    # in a child process: importing compile_report turns the interpreter off for later imports
    code = (
        "from folio.kernels.compile_report import _pdl_order as f\n"
        "print(f('LDG.E.128 R4, [R2]\\nACQBULK ;\\nSTG.E [R6], R4'), f('ACQBULK ;\\nLDG.E R4, [R2]'),\n"
        "      f('STG.E [R6], R4\\nACQBULK ;'), f('LDG.E R4, [R2]\\nSTG.E [R6], R4'))\n"
    )
    assert _child_prints(code) == ["ld+wait", "wait", "STORE", "-"]


def test_wgmma_operand_races_read_the_sass():
    """An instruction naming an in-flight wgmma's A registers before the wait that retires it is a
    race (the Gluon prefill's NaN of session 18); after the wait, or other registers, it is not.
    Any operand position counts, and addresses past 0xffff are read."""
    from folio.kernels.sass_checks import wgmma_operand_races as races

    h = "/*0010*/ HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88, gsb0 ;"
    w = "/*0030*/ WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"
    assert races(h + "\n/*0020*/ FSEL R154, R92, -INF , !P0 ;\n" + w) == 1
    assert races(h + "\n" + w + "\n/*0040*/ FSEL R154, R92, -INF , !P0 ;") == 0
    assert races(h + "\n/*0020*/ FSEL R156, R92, -INF , !P0 ;\n" + w) == 0
    assert races(h + "\n/*0020*/ @!P0 MOV R152, R3 ;\n" + w) == 1
    assert races(h + "\n/*0020*/ SHFL.BFLY PT, R155, R92, 0x1, 0x1f ;\n" + w) == 1  # destination second
    assert races(h + "\n/*0020*/ LOP3.LUT P0, R153, R2, R3, RZ, 0xc0, !PT ;\n" + w) == 1
    assert races(h + "\n/*0020*/ IMAD.WIDE R151, R2, R3, RZ ;\n" + w) == 1  # a pair: R151 and R152
    far = h.replace("/*0010*/", "/*11110*/") + "\n/*11130*/ FSEL R154, R92, -INF , !P0 ;\n" + w.replace("0030", "11140")
    assert races(far) == 1
    # wait(1) after a later group: the register-A group is retired; as the last group it is not
    s_next = "/*0020*/ HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT, gsb0 ;"
    w1 = "/*0030*/ WARPGROUP.DEPBAR.LE gsb0, 0x1 ;"
    late = "/*0040*/ F2FP.BF16.F32.PACK_AB R152, R1, R2 ;"
    assert races("\n".join([h, s_next, w1, late])) == 0
    assert races("\n".join([s_next.replace("0020", "0008"), h, w1, late])) == 1


def test_a_racing_compilation_is_refused_at_every_launch(monkeypatch, caplog):
    """check_no_wgmma_race reads a compilation's SASS once (by its hash) and raises at every launch
    of one that races, so the backend falls back to the Triton kernel; a clean one passes, and SASS
    that cannot be read (no cuobjdump) is a warning, once, not an error."""
    import logging
    from types import SimpleNamespace

    from folio.kernels import sass_checks

    racing = ("/*0010*/ HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88, gsb0 ;\n"
              "/*0020*/ FSEL R154, R92, -INF , !P0 ;\n/*0030*/ WARPGROUP.DEPBAR.LE gsb0, 0x0 ;")
    reads = []

    def fake_sass(cubin):
        reads.append(cubin)
        if cubin == b"gone":
            raise FileNotFoundError("cuobjdump")
        return racing if cubin == b"racing" else racing.replace("R154", "R12")

    monkeypatch.setattr(sass_checks, "sass_of", fake_sass)
    monkeypatch.setattr(sass_checks, "_verdicts", {})
    monkeypatch.setattr(sass_checks, "_unread_logged", False)
    kernel = lambda h, cubin: SimpleNamespace(hash=h, asm={"cubin": cubin})  # noqa: E731
    for _ in range(2):
        with pytest.raises(RuntimeError, match="running wgmma"):
            sass_checks.check_no_wgmma_race(kernel("a", b"racing"), "k")
    with caplog.at_level(logging.WARNING, logger="folio"):
        for h, cubin in (("b", b"clean"), ("c", b"gone"), ("d", b"gone"), ("b", b"clean")):
            sass_checks.check_no_wgmma_race(kernel(h, cubin), "k")
    sass_checks.check_no_wgmma_race(None, "k")  # a launch that hands back no kernel
    assert reads == [b"racing", b"clean", b"gone", b"gone"]
    assert caplog.text.count("running it unchecked") == 1


def test_the_launch_check_reads_a_real_compilation():
    """On a real sm_90 compilation of the Gluon prefill (compiled here, no GPU): the check finds
    the kernel's hash and cubin, reads its SASS and finds no race."""
    from folio.kernels.prefill_attention_hopper import HAS_GLUON

    if not HAS_GLUON:
        pytest.skip("needs Triton's Gluon")
    code = (
        "import torch\n"
        "from folio.kernels import compile_report as cr, sass_checks\n"
        "from folio.kernels import prefill_attention_hopper as hopper\n"
        "results = []\n"
        "cr._compile_instead_of_launch(90, results)\n"
        "cr._allow_cpu_stand_ins()\n"
        "q = torch.zeros(256, 16, 128, dtype=torch.bfloat16)\n"
        "kv = torch.zeros(2, 64, 16, 8, 128, dtype=torch.bfloat16)\n"
        "hopper.hopper_prefill_attention(q, kv, torch.arange(9, dtype=torch.int32),\n"
        "                                torch.full((8,), 100, dtype=torch.int32), torch.zeros(8, 8, dtype=torch.int32), 8, 0.1)\n"
        "sass_checks.check_no_wgmma_race(results[0][1], 'hopper')\n"
        "print(len(sass_checks._verdicts), sum(sass_checks._verdicts.values()))\n"
    )
    assert _child_prints(code) == ["1", "0"]
