"""Shared pytest setup: CPU-only, few threads (CI has 2 cores), quiet logs."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Triton decides at decoration time whether a jit function is interpreted, and transformers'
# model classes import triton.language (whose helpers such as tl.cdiv are jit functions): on a
# machine without CUDA the interpreter must be on before any test module imports transformers.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
