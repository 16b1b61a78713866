"""What ptxas decided, read back from a compiled kernel's SASS: the choices the source cannot show.

- `cuobjdump(cubin, option)` / `sass_of(cubin)`: cuobjdump's reports (shipped with Triton's NVIDIA
  backend).
- `wgmma_operand_races(sass)`: instructions naming the registers of an in-flight wgmma's A operand
  (P in registers) before the `WARPGROUP.DEPBAR.LE` that retires it. ptxas does not guard
  those registers. A dep of Gluon's warpgroup_mma_wait keeps P's 16-bit values alive to the wait
  but not the packed 32-bit registers the wgmma reads, so whether the next tile's softmax lands on
  them is ptxas's choice, compilation by compilation (NaN on the GPU when it did, session 18).

- `check_no_wgmma_race(kernel, name)`: the same read of a compilation at its launch, once a
  compilation, raising at every launch of one that races.

compile_report.py reads every kernel it compiles and marks such a kernel `HGMMA-race`. The Gluon
prefill keeps P in registers (sessions 18 and 26; from session 19 to 25 it went through shared
memory): tests/kernels/test_compile_sm90.py fails on a race at any shape it admits, and the
kernel's launch checks its compilation on the machine it runs on.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from folio.logger import init_logger

logger = init_logger(__name__)


def cuobjdump(cubin: bytes, option: str) -> str:
    """cuobjdump's output for a cubin: "-sass" (lines carry their /*addr*/ prefixes) or
    "-res-usage" (registers, stack, shared memory)."""
    from triton import knobs

    tool = os.path.join(os.path.dirname(knobs.nvidia.ptxas.path), "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, option, path], capture_output=True, text=True, check=True, timeout=120).stdout


def sass_of(cubin: bytes) -> str:
    return cuobjdump(cubin, "-sass")


_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")  # cuobjdump's /*0a30*/, five digits and more past 0xffff
_SKIPPED = re.compile(r"[HQ]GMMA|BRA|BAR|SYNCS|WARPGROUP|NOP|EXIT")  # no register of P read or written


def _registers_named(instruction: str) -> set[str]:
    """The 32-bit registers an instruction names in any operand position: R5 and, for 64- and
    128-bit forms (.64, .WIDE, .128), the registers the pair or quad spans."""
    opcode, _, operands = instruction.partition(" ")
    width = 4 if ".128" in opcode else 2 if (".64" in opcode or ".WIDE" in opcode) else 1
    named = set()
    for r in re.findall(r"\bR(\d+)\b", operands):
        named.update(f"R{int(r) + k}" for k in range(width))
    return named


def wgmma_operand_races(sass: str) -> int:
    """How many register-A wgmmas have an operand register named by another instruction before the
    wait that retires them (0 for a kernel that keeps its P alive, or that has no register-A
    wgmma). A wgmma's group ends at the first `gsb0` wgmma from it on; `WARPGROUP.DEPBAR.LE gsb0,
    N` retires it once N or more groups closed after its own. The scan follows the listing's
    order (each loop body is laid out in one piece); any mention counts, read or written, as the
    destination may be any operand (SHFL's second, after a predicate)."""
    lines = [line.split(";")[0] for line in sass.splitlines() if _ADDRESS.search(line)]
    races = 0
    for i, line in enumerate(lines):
        m = re.search(r"[HQ]GMMA\.\S+ R\d+, R(\d+), gdesc", line)
        if not m:
            continue
        operand = {f"R{int(m.group(1)) + k}" for k in range(4)}
        own_closed = "gsb0" in line
        later = 0  # groups closed after this wgmma's own
        for after in lines[i + 1:]:
            instruction = re.sub(r"^.*?\*/\s*(@!?U?P\w+\s+)?", "", after).strip()
            if re.match(r"[HQ]GMMA\.", instruction):
                if "gsb0" in instruction:
                    later += own_closed
                    own_closed = True
                continue
            wait = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", instruction)
            if wait and own_closed and later >= int(wait.group(1), 16):
                break
            if not _SKIPPED.match(instruction) and _registers_named(instruction) & operand:
                races += 1
                break
    return races


_verdicts: dict[str, int] = {}  # a compilation's hash -> how many races its SASS has
_unread_logged = False


def check_no_wgmma_race(kernel, name: str) -> None:  # noqa: ANN001 - a Triton CompiledKernel
    """Raise, at every launch, if this compilation of `name` names a running wgmma's register
    operand; its SASS is read once (by the compilation's hash). The compile test covers CI's
    ptxas, this the one on the machine. No cubin, or SASS that cannot be read (no cuobjdump):
    a warning, once, and nothing raised."""
    global _unread_logged
    key = getattr(kernel, "hash", None)
    cubin = getattr(kernel, "asm", {}).get("cubin") if key is not None else None
    if cubin is None:
        return
    races = _verdicts.get(key)
    if races is None:
        try:
            races = wgmma_operand_races(sass_of(cubin))
        except Exception as e:  # noqa: BLE001 - no cuobjdump, a timeout, a ptxas not found: not a verdict
            races = 0
            if not _unread_logged:
                _unread_logged = True
                logger.warning("Could not read %s's SASS to check it for wgmma races (%s: %s); running it "
                               "unchecked.", name, type(e).__name__, e)
        _verdicts[key] = races
    if races:
        raise RuntimeError(f"{name}: ptxas writes the registers of a running wgmma's operand ({races} "
                           "places); its results would be wrong with this Triton's ptxas.")
