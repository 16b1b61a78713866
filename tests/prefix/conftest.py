"""Shared setup for the memory-sharing tests: tiny checkpoints, built once per session."""

from __future__ import annotations

import pytest

from tests.helpers.checkpoints import tiny_model_dir


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A tiny Llama with the test tokenizer, path by kind (built once per session)."""
    paths: dict[str, str] = {}

    def get(kind: str = "llama") -> str:
        if kind not in paths:
            paths[kind] = tiny_model_dir(tmp_path_factory, kind)
        return paths[kind]

    return get
