"""What ptxas decided, read back from a compiled kernel's SASS: the choices the source cannot show.

- `sass_of(cubin)`: the SASS text (cuobjdump, shipped with Triton's NVIDIA backend).
- `wgmma_operand_races(sass)`: writes to the registers of an in-flight wgmma's A operand (P in
  registers) before the `WARPGROUP.DEPBAR.LE gsb0, 0x0` that retires it. ptxas does not guard
  those registers. A dep of Gluon's warpgroup_mma_wait keeps P's 16-bit values alive to the wait
  but not the packed 32-bit registers the wgmma reads, so whether the next tile's softmax lands on
  them is ptxas's choice, compilation by compilation (NaN on the GPU when it does, session 18).

compile_report.py uses both on every kernel it compiles; prefill_attention_hopper.py checks each
compilation of its kernel once, at its first launch, and refuses a racy one (the attention
backend then falls back to the Triton kernel).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


def sass_of(cubin: bytes) -> str:
    """cuobjdump -sass of a cubin (the lines carry their /*addr*/ prefixes)."""
    from triton import knobs

    tool = os.path.join(os.path.dirname(knobs.nvidia.ptxas.path), "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout


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
