"""One tiny checkpoint (with the test tokenizer and its chat template) for the vLLM drop-in tests."""

from __future__ import annotations

import pytest

from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("compat-qwen3"))
    make_tiny_checkpoint("qwen3", path)
    save_test_tokenizer(path)
    return path
