"""Kernel tests: on the CPU through Triton's interpreter at small shapes, on a GPU at full size.

Triton picks the interpreter when a kernel is decorated, so TRITON_INTERPRET must be set before
any folio.kernels module is imported; folio/kernels/triton_compat.py does the same for non-test
imports. Tests marked `gpu` run full-size shapes and are skipped without a CUDA device.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
except ImportError:  # a CPU install without the test extra: nothing here can run
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def _skip_gpu_tests_without_cuda(request):
    if request.node.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.fixture
def device() -> torch.device:
    """Where the small-shape tests run: the GPU when there is one, else the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
