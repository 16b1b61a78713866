"""Loading a checkpoint's tokenizer, and the token ids that end a generation."""

from __future__ import annotations

import glob
import os
from typing import Any

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

TOKENIZER_MODES = ("auto", "slow")
# Any one of these in a folder means it carries a tokenizer AutoTokenizer can try to load.
_TOKENIZER_FILE_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "*.tiktoken",
)


def get_tokenizer(path: str, *, tokenizer_mode: str = "auto") -> PreTrainedTokenizerBase:
    """The tokenizer in a checkpoint folder (or hub id), via AutoTokenizer, never running remote code.

    tokenizer_mode "auto" prefers the fast (Rust) tokenizer; "slow" asks for the Python one.
    Raises ValueError when there is no tokenizer to load.
    """
    if tokenizer_mode not in TOKENIZER_MODES:
        raise ValueError(f"tokenizer_mode must be one of {TOKENIZER_MODES}, got {tokenizer_mode!r}.")
    if os.path.isdir(path) and not has_tokenizer_files(path):
        raise ValueError(
            f"No tokenizer found in {path!r}: expected tokenizer.json or tokenizer_config.json "
            "(with its vocabulary files). Pass a folder that has one (--tokenizer)."
        )
    try:
        return AutoTokenizer.from_pretrained(
            path, trust_remote_code=False, use_fast=tokenizer_mode != "slow"
        )
    except StrictDataclassError as e:
        # AutoTokenizer reads config.json too, and transformers' typed configs reject bad fields
        # with an error that is no ValueError (the CLI printed a traceback): name the file.
        raise ValueError(f"{os.path.join(path, 'config.json')} is invalid: {' '.join(str(e).split())}") from None
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        raise ValueError(f"Could not load a tokenizer from {path!r}: {e}") from e


def load_model_tokenizer(model: str, tokenizer: str, skip_tokenizer_init: bool = False) -> Any:
    """The engine's tokenizer; None (token-id prompts only, no text) when the model folder has
    none and no other tokenizer was named, e.g. a config.json alone with --load-format dummy."""
    if skip_tokenizer_init:
        return None
    if tokenizer == model and os.path.isdir(tokenizer) and not has_tokenizer_files(tokenizer):
        from folio.logger import init_logger

        init_logger(__name__).warning(
            "No tokenizer files in %r: running without a tokenizer. Prompts must be token ids "
            "({'prompt_token_ids': [...]}) and outputs carry no text; pass --tokenizer to add one.",
            tokenizer,
        )
        return None
    return get_tokenizer(tokenizer)


def has_tokenizer_files(folder: str) -> bool:
    return any(glob.glob(os.path.join(glob.escape(folder), p)) for p in _TOKENIZER_FILE_PATTERNS)


def eos_token_ids(tokenizer: Any, generation_config: dict[str, Any]) -> set[int]:
    """The tokenizer's eos id plus generation_config's eos_token_id (an int or a list of ints).

    Chat models often end a turn with a token (e.g. <|im_end|>) that only generation_config
    names, so both sources count.
    """
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = generation_config.get("eos_token_id")
    if not isinstance(configured, (list, tuple)):
        configured = [configured]
    ids.update(int(i) for i in configured if isinstance(i, int) and not isinstance(i, bool))
    return ids
