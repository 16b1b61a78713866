"""What ptxas decided, read back from a compiled kernel's SASS: the choices the source cannot show.

- `cuobjdump(cubin, option)` / `sass_of(cubin)`: cuobjdump's reports (shipped with Triton's NVIDIA
  backend).
- `wgmma_operand_races(sass)`: writes to the registers of an in-flight wgmma's A operand (P in
  registers) before the `WARPGROUP.DEPBAR.LE gsb0, 0x0` that retires it. ptxas does not guard
  those registers. A dep of Gluon's warpgroup_mma_wait keeps P's 16-bit values alive to the wait
  but not the packed 32-bit registers the wgmma reads, so whether the next tile's softmax lands on
  them is ptxas's choice, compilation by compilation (NaN on the GPU when it does, session 18).

- `check_compiled(kernel, name)`: once per compilation, refuse a racy one.

compile_report.py reads every kernel it compiles; prefill_attention_hopper.py checks each
compilation of its kernel at its first launch (the attention backend then falls back to the
Triton kernel).
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
        return subprocess.run([tool, option, path], capture_output=True, text=True, check=True).stdout


def sass_of(cubin: bytes) -> str:
    return cuobjdump(cubin, "-sass")


_CHECKED: dict[str, int] = {}  # compiled kernel's hash -> races found in its SASS


def check_compiled(kernel, name: str) -> None:
    """Once per compilation (call it after each launch; the first one reads): raise if ptxas
    placed a write to a register-A wgmma's operand under the wgmma (wgmma_operand_races). The
    output of that launch is then suspect; the caller's fallback recomputes it. A SASS that
    cannot be read (no cuobjdump) passes: the sm_90 compile test covers the shapes with the
    Triton folio ships with. kernel None (compile_report's stand-in launch) is not checked."""
    if kernel is None:
        return
    key = getattr(kernel, "hash", None) or str(id(kernel))
    if key not in _CHECKED:
        try:
            _CHECKED[key] = wgmma_operand_races(sass_of(kernel.asm["cubin"]))
        except Exception as e:  # noqa: BLE001 - a check we cannot run is not a failure of the kernel
            logger.debug("Could not read the SASS of %s (%s); not checked.", name, e)
            _CHECKED[key] = 0
    if _CHECKED[key]:
        raise RuntimeError(f"ptxas reuses P's registers under a running P V in this compilation of {name} "
                           f"({_CHECKED[key]} places in its SASS): its output would be wrong.")


def wgmma_operand_races(sass: str) -> int:
    """How many register-A wgmmas have an operand register written before the wait that retires
    them (0 for a kernel that keeps its P alive, or that has no register-A wgmma)."""
    lines = [line.split(";")[0] for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    races = 0
    for i, line in enumerate(lines):
        m = re.search(r"[HQ]GMMA\.\S+ R\d+, R(\d+), gdesc", line)
        if not m:
            continue
        operand = {f"R{int(m.group(1)) + k}" for k in range(4)}
        for later in lines[i + 1:]:
            if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in later:
                break
            words = re.sub(r"^.*?\*/\s*(@!?U?P\w+\s+)?", "", later).split()
            if len(words) > 1 and not re.match(r"[HQ]GMMA|ST|BRA|BAR|SYNCS|WARPGROUP", words[0]) \
                    and words[1].rstrip(",") in operand:
                races += 1
                break
    return races
