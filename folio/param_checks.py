"""Checks of request parameters shared by SamplingParams and BeamSearchParams: one error type
that names the field, and the normalisations each field gets before it is stored."""

from __future__ import annotations

import inspect
import math
import re
from typing import Any


class SamplingParamsError(ValueError):
    """A sampling parameter is invalid; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def logits_processor_arity(proc: Any) -> int:
    """2 for (output_ids, logits), 3 for (prompt_ids, output_ids, logits); else an error."""
    if not callable(proc):
        raise SamplingParamsError("logits_processors", f"logits_processors must be callables, got {proc!r}.")
    try:
        params = inspect.signature(proc).parameters.values()
    except (TypeError, ValueError):
        return 2  # a builtin without a signature: the two-argument form
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(positional) in (2, 3):
        return 3 if len(positional) == 3 else 2
    raise SamplingParamsError(
        "logits_processors",
        f"logits_processors: each takes (token_ids, logits) or (prompt_token_ids, token_ids, logits); {proc!r} does not.",
    )


def normalize_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise SamplingParamsError("stop", "stop must be a string or a list of strings.")
    if any(s == "" for s in stop):
        raise SamplingParamsError("stop", "stop cannot contain an empty string.")
    return list(stop)


def normalize_token_list(name: str, ids: Any) -> list[int]:
    """A list of token ids; None means empty. Each id is checked by the caller's _verify."""
    if ids is None:
        return []
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set, frozenset)):
        raise SamplingParamsError(name, f"{name} must be a list of token ids, got {ids!r}.")
    return list(ids)


def normalize_logit_bias(bias: Any) -> dict[int, float]:
    if not isinstance(bias, dict):
        raise SamplingParamsError("logit_bias", "logit_bias must map token ids to numbers.")
    out: dict[int, float] = {}
    for key, value in bias.items():
        tok = _bias_token_id(key)
        if tok < 0:
            raise SamplingParamsError("logit_bias", f"logit_bias token id {tok} is negative.")
        if tok in out:  # 5 and "5" in one offline dict: which bias wins would be a guess
            raise SamplingParamsError("logit_bias", f"logit_bias names token {tok} twice.")
        check_range("logit_bias", value, -100.0, 100.0)
        out[tok] = float(value)
    return out


# A key as JSON writes a token id: ASCII digits, no sign but "-", no leading zero, no "_" or spaces.
# int() alone would read "1_0" as 10, " 5" and "05" as 5 and "５" (a full-width digit) as 5.
_TOKEN_ID_KEY = re.compile(r"-?(0|[1-9][0-9]*)")


def _bias_token_id(key: Any) -> int:
    """A logit_bias key as a token id: an int (not a bool), or its canonical decimal string."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and _TOKEN_ID_KEY.fullmatch(key):
        return int(key)
    raise SamplingParamsError(
        "logit_bias", f"logit_bias keys must be token ids written as decimal integers, got {key!r}."
    )


MAX_LENGTH_PENALTY = 10.0


def check_number(name: str, value: Any) -> None:
    # NaN and infinities are refused: on the device they turn whole rows of logits into NaN.
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad_type or (isinstance(value, float) and not math.isfinite(value)):
        raise SamplingParamsError(name, f"{name} must be a finite number, got {value!r}.")


def check_range(name: str, value: Any, low: float, high: float) -> None:
    check_number(name, value)
    if not low <= value <= high:
        raise SamplingParamsError(name, f"{name} must be in [{low}, {high}], got {value}.")


def check_int(name: str, value: Any, minimum: int, what: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(name, f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise SamplingParamsError(
            name, f"{name} must be {what or f'at least {minimum}'}, got {value}."
        )


def check_bool(name: str, value: Any, param: str | None = None) -> None:
    """A JSON boolean only: "false" or 0 would be read by truthiness."""
    if not isinstance(value, bool):
        raise SamplingParamsError(param or name, f"{name} must be a boolean, got {value!r}.")
