"""max_num_batched_tokens defaults by device: 16,384 on large GPUs, 8,192 elsewhere."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from folio.engine.arg_utils import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    LARGE_GPU_MAX_NUM_BATCHED_TOKENS,
    EngineArgs,
    default_max_num_batched_tokens,
)


@pytest.mark.parametrize("memory_gib, expected", [(80, LARGE_GPU_MAX_NUM_BATCHED_TOKENS), (24, DEFAULT_MAX_NUM_BATCHED_TOKENS)])
def test_gpu_default_follows_device_memory(monkeypatch, memory_gib, expected):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=memory_gib * 2**30))
    assert default_max_num_batched_tokens("cuda") == expected
    # The rules around the default are unchanged: at least max_num_seqs, an explicit value wins.
    assert EngineArgs(max_num_seqs=20000)._max_num_batched_tokens(4096, "cuda") == 20000
    assert EngineArgs(max_num_batched_tokens=512)._max_num_batched_tokens(4096, "cuda") == 512
    assert EngineArgs(enable_chunked_prefill=False)._max_num_batched_tokens(40000, "cuda") == 40000


def test_cpu_keeps_the_small_default():
    assert default_max_num_batched_tokens("cpu") == DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert EngineArgs()._max_num_batched_tokens(4096, "cpu") == DEFAULT_MAX_NUM_BATCHED_TOKENS
