"""Where a model lives on disk: a local folder, the built-in demo model, or a hub download."""

from __future__ import annotations

import os

from folio.logger import init_logger

logger = init_logger(__name__)

# Files a checkpoint needs; anything else in a hub repo (other formats, images) is skipped.
_HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.jinja",
    "*.model",
    "*.tiktoken",
    "tokenizer*",
    "merges.txt",
    "vocab.*",
]


def resolve_model_path(model: str | None) -> str:
    """A local folder for `model`: itself, the demo model for None, or a hub snapshot."""
    if model is None:
        from folio.demo.model import ensure_demo_model

        return ensure_demo_model()
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        return os.path.abspath(expanded)
    if os.path.exists(expanded):
        raise ValueError(f"{model!r} is a file; pass the checkpoint's folder.")
    return _download(model)


def _download(repo_id: str) -> str:
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/")):
        raise ValueError(
            f"{repo_id!r} is not a local folder, nor a hub id of the form 'org/name'."
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise ValueError(f"{repo_id!r} is not a local folder and huggingface_hub is missing.") from None
    logger.info("Fetching %s from the Hugging Face hub", repo_id)
    try:
        return snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS)
    except Exception as e:  # network, auth, unknown repo: all end the same way for the user
        raise ValueError(
            f"{repo_id!r} is not a local folder and could not be fetched from the hub "
            f"({type(e).__name__}: {e}). Pass a checkpoint folder instead."
        ) from None
