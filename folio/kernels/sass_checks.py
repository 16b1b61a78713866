"""What ptxas decided, read back from a compiled kernel's SASS: the choices the source cannot show.

- `cuobjdump(cubin, option)` / `sass_of(cubin)`: cuobjdump's reports (shipped with Triton's NVIDIA
  backend).
- `wgmma_operand_races(sass)`: writes to the registers of an in-flight wgmma's A operand (P in
  registers) before the `WARPGROUP.DEPBAR.LE gsb0, 0x0` that retires it. ptxas does not guard
  those registers. A dep of Gluon's warpgroup_mma_wait keeps P's 16-bit values alive to the wait
  but not the packed 32-bit registers the wgmma reads, so whether the next tile's softmax lands on
  them is ptxas's choice, compilation by compilation (NaN on the GPU when it did, session 18).

compile_report.py reads every kernel it compiles and marks such a kernel `HGMMA-race`. The Gluon
prefill keeps P in registers (sessions 18 and 26; from session 19 to 25 it went through shared
memory), and tests/kernels/test_compile_sm90.py fails on a race at any shape it admits.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


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


_checked: set[str] = set()


def check_no_wgmma_race(kernel, name: str) -> None:  # noqa: ANN001 - a Triton CompiledKernel
    """Raise if this compilation of `name` writes a running wgmma's register operand, read once
    per compilation (its hash) at its first launch: the compile test covers CI's ptxas, this
    covers the one on the machine. No cubin or no cuobjdump: nothing to read, nothing raised."""
    key = getattr(kernel, "hash", None)
    cubin = getattr(kernel, "asm", {}).get("cubin") if key is not None else None
    if cubin is None or key in _checked:
        return
    try:
        sass = sass_of(cubin)
    except (OSError, subprocess.CalledProcessError):
        _checked.add(key)
        return
    _checked.add(key)
    if races := wgmma_operand_races(sass):
        raise RuntimeError(f"{name}: ptxas writes the registers of a running wgmma's operand ({races} "
                           "places); its results would be wrong with this Triton's ptxas.")
