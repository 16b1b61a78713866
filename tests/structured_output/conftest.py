"""The tiny checkpoint (with the test tokenizer) the offline structured-output tests run."""

from __future__ import annotations

import pytest

from tests.helpers.checkpoints import tiny_model_dir


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, "llama")
