"""Worker tests: the step-input builder and block table on the CPU; CUDA graphs and the Triton
path against the torch path on a GPU (tests marked `gpu`, skipped without a CUDA device)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _skip_gpu_tests_without_cuda(request):
    if request.node.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
