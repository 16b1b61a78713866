"""A checkpoint's config.json: read, merged with hf_overrides, and its model sizes checked.

The sizes are checked here, once, because every later use trusts them: a zero layer count
divided the swap-pool sizing by zero, a negative max_position_embeddings reached torch.arange,
and a string or a missing hidden_size failed inside transformers' own validation (when the
tokenizer loaded) with a traceback that named neither the file nor how to fix it.
"""

from __future__ import annotations

import json
import os
from typing import Any

# Sizes every supported architecture reads (folio/models/*): positive integers, required.
REQUIRED_SIZES = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")
# Sizes a config may leave out (or set to null); positive integers when given.
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")


def load_hf_config(model: str) -> dict[str, Any]:
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"No config.json in {model!r}: pass a Hugging Face checkpoint folder "
            "(config.json + *.safetensors + tokenizer files)."
        )
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object.")
    # Multimodal wrappers keep the language model under text_config; we serve that part.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        text = dict(config["text_config"])
        text.setdefault("architectures", config.get("architectures"))
        config = text
    return config


def apply_hf_overrides(config: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's hf_overrides: keys merged over config.json (nested dicts merged key by key)."""
    if overrides is None:
        return config
    if not isinstance(overrides, dict):
        raise ValueError(f"hf_overrides must be a dict of config.json keys, got {overrides!r}.")
    merged = dict(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def check_model_sizes(model: str, config: dict[str, Any], overrides: dict[str, Any] | None) -> None:
    """ValueError unless the model's sizes are positive integers, naming where the bad value came
    from: hf_overrides (--hf-overrides) when it set the key, else the checkpoint's config.json."""
    overridden = set(overrides or ())
    for key in REQUIRED_SIZES + OPTIONAL_SIZES:
        value = config.get(key)
        source = ("hf_overrides (--hf-overrides)" if key in overridden
                  else os.path.join(model, "config.json"))
        if key not in config and key in REQUIRED_SIZES:
            raise ValueError(f"{source} has no {key!r}: folio needs it to build the model (a positive integer).")
        if value is None and key in OPTIONAL_SIZES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{source}: {key} must be a positive integer, got {value!r}.")
