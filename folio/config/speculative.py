"""SpeculativeConfig: vLLM's `speculative_config` — which proposer drafts tokens, and how many.

Two methods, as vLLM names them:
- "ngram": prompt lookup on the host; the last n tokens (prompt_lookup_max down to
  prompt_lookup_min) are searched for in the request's earlier tokens and the tokens that
  followed the match are proposed;
- "draft_model": a smaller model sharing the target's vocabulary runs k autoregressive steps;
  `{"model": PATH, ...}` without a method means this one.

Built once from the user's dict (or the server's JSON string) and validated there; unknown
keys are errors, never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft_model")
_ALIASES = {"draft_model": "draft_model", "ngram": "ngram", "[ngram]": "ngram"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4  # ngram: longest suffix looked up
    prompt_lookup_min: int = 1  # ngram: shortest suffix looked up
    model: str | None = None  # draft_model: the draft's checkpoint folder (resolved)
    # No drafts in steps that sample for at least this many requests (vLLM's name): at large
    # batch the target step is compute-bound and verifying drafts costs more than it saves.
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config method must be one of {METHODS}, got {self.method!r}.")
        _check_positive("num_speculative_tokens", self.num_speculative_tokens)
        if self.disable_by_batch_size is not None:
            _check_positive("disable_by_batch_size", self.disable_by_batch_size)
        if self.method == "ngram":
            _check_positive("prompt_lookup_min", self.prompt_lookup_min)
            _check_positive("prompt_lookup_max", self.prompt_lookup_max)
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError(
                    f"prompt_lookup_min ({self.prompt_lookup_min}) is larger than "
                    f"prompt_lookup_max ({self.prompt_lookup_max})."
                )
            if self.model is not None:
                raise ValueError("speculative_config: 'model' has no meaning with method 'ngram'.")
        elif not self.model:
            raise ValueError("speculative_config method 'draft_model' needs 'model' (a checkpoint path).")

    @classmethod
    def from_user(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """From LLM(speculative_config={...}) or --speculative-config '{...}'; None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict (or a JSON object), got {type(value).__name__}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"Unknown speculative_config key(s): {', '.join(unknown)}. Known: {', '.join(sorted(known))}.")
        kwargs = dict(value)
        method = kwargs.pop("method", None)
        if method is None:
            method = "draft_model" if kwargs.get("model") else None
        if method is None:
            raise ValueError("speculative_config needs 'method' ('ngram') or 'model' (a draft checkpoint).")
        if method not in _ALIASES:
            raise ValueError(f"speculative_config method must be one of {METHODS}, got {method!r}.")
        if "num_speculative_tokens" not in kwargs:
            raise ValueError("speculative_config needs 'num_speculative_tokens'.")
        return cls(method=_ALIASES[method], **kwargs)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config {name} must be a positive integer, got {value!r}.")
