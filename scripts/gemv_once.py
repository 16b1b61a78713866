"""Launch the W4A16 GEMV a few times at Llama-3.1-8B's QKV shape (M = 1), for a profiler.

    ncu --clock-control none --kernel-name regex:_w4a16_gemv_kernel --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats python3 scripts/gemv_once.py

Runs the default (chains) K steps then the columns ones (STEP=3, with their 256-column tile),
3 launches each, so a profile of launches 3 and 4 (0-based 2, 3) sees one warm launch of each.
Issue 13: session 8's profile of this script found the GEMV of the time issue-bound
(docs/perf-notes.md).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from folio.kernels.w4a16_gemm import pack_rows, pick_config, w4a16_gemm_triton  # noqa: E402


def main() -> None:
    k, n, group = 4096, 6144, 128
    gen = torch.Generator().manual_seed(0)
    qweight = pack_rows(torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)).cuda()
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).cuda()
    x = torch.randn(1, k, generator=gen).to("cuda", torch.bfloat16)
    default = pick_config(1, n, k, group, torch.cuda.get_device_properties(0).multi_processor_count)
    columns = {**default, "STEP": 3, "BLOCK_N": 256}
    for config in (default, columns):
        for _ in range(3):
            w4a16_gemm_triton(x, qweight, scales, None, group, config=dict(config))
    torch.cuda.synchronize()
    print("config", default)


if __name__ == "__main__":
    main()
