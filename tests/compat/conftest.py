"""One tiny checkpoint (with the test tokenizer and its chat template) for the vLLM drop-in tests."""

from __future__ import annotations

import pytest

from tests.helpers.checkpoints import tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "qwen3", "compat-qwen3")
