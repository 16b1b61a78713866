"""Shared setup for the memory-sharing tests: tiny checkpoints, built once per session."""

from __future__ import annotations

import pytest

from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A tiny Llama with the test tokenizer, path by kind (built once per session)."""
    paths: dict[str, str] = {}

    def get(kind: str = "llama") -> str:
        if kind not in paths:
            path = str(tmp_path_factory.mktemp(kind))
            make_tiny_checkpoint(kind, path)
            save_test_tokenizer(path)
            paths[kind] = path
        return paths[kind]

    return get
