"""LoRA tests: adapters made with peft on the tiny checkpoints; `gpu` tests skipped without CUDA."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _skip_gpu_tests_without_cuda(request):
    if request.node.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
