"""vLLM's generation_config / override_generation_config: the sampling defaults a model serves with.

A checkpoint's own generation_config.json may carry values folio cannot use: the engine logs
them and serves without (the user did not write them). override_generation_config is the user's
flag, so a bad value there is a ValueError naming it, at startup, rather than a warning that
blamed generation_config.json and silently dropped every default.
"""

from __future__ import annotations

import json
import os
from typing import Any

# generation_config keys that become SamplingParams defaults (llm_engine._GENERATION_DEFAULTS,
# plus max_new_tokens -> max_tokens), checked the way SamplingParams checks them.
SAMPLING_DEFAULTS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_FLAG = "override_generation_config (--override-generation-config)"


def resolve_generation_config(
    model: str, source: str, overrides: dict[str, Any] | None
) -> dict[str, Any]:
    """vLLM's generation_config: 'auto' reads the checkpoint's generation_config.json, 'vllm'
    uses no sampling defaults (the EOS ids it names still stop generation), anything else is
    a folder holding one; override_generation_config is merged over the result."""
    check_generation_overrides(overrides)
    if source == "auto":
        config = load_generation_config(model)
    elif source == "vllm":
        own = load_generation_config(model)
        config = {"eos_token_id": own["eos_token_id"]} if "eos_token_id" in own else {}
    elif isinstance(source, str) and os.path.isdir(os.path.expanduser(source)):
        config = load_generation_config(os.path.expanduser(source))
    else:
        raise ValueError(
            f"generation_config must be 'auto', 'vllm' or a folder with generation_config.json, got {source!r}."
        )
    return {**config, **(overrides or {})}


def check_generation_overrides(overrides: dict[str, Any] | None) -> None:
    """ValueError naming the flag and the key unless every sampling default it sets is valid."""
    if overrides is None:
        return
    if not isinstance(overrides, dict):
        raise ValueError(f"{_FLAG} must be a dict, got {overrides!r}.")
    from folio.sampling_params import SamplingParams  # the one place the sampling rules live

    for key, param in SAMPLING_DEFAULTS.items():
        if overrides.get(key) is None:  # None: no default, as in generation_config.json
            continue
        try:
            SamplingParams(**{param: overrides[key]})
        except ValueError as e:
            raise ValueError(f"{_FLAG}: {key!r}: {e}") from None
    _check_eos_ids(overrides.get("eos_token_id"))


def _check_eos_ids(value: Any) -> None:
    ids = value if isinstance(value, (list, tuple)) else [value]
    if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{_FLAG}: 'eos_token_id' must be a token id or a list of token ids, got {value!r}.")


def load_generation_config(model: str) -> dict[str, Any]:
    path = os.path.join(model, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError:
            return {}
    return data if isinstance(data, dict) else {}
