"""SamplingParams: how one request's tokens are chosen, with vLLM's field names and meaning.

Pure Python (no torch) so that `core/` can read it. Every invalid value raises
`SamplingParamsError` (a `ValueError`) whose `param` names the offending field; the server
turns that into a 400 whose `param` is the same name.
"""

from __future__ import annotations

import copy
import enum
import functools
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field, fields
from typing import Any

from folio.param_checks import (
    MAX_LENGTH_PENALTY,
    SamplingParamsError,
    check_bool,
    check_int,
    check_number,
    check_range,
    logits_processor_arity,
    normalize_logit_bias,
    normalize_stop,
    normalize_token_list,
)
from folio.logger import init_logger

logger = init_logger(__name__)

# Below this temperature sampling is greedy (argmax), as in vLLM.
GREEDY_EPS = 1e-5


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput carries while a request streams."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


# The constraint kinds of StructuredOutputsParams, exactly one of which a request sets.
STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """Constrain a request's output to a language (vLLM 0.22's names): set exactly one of
    json (a JSON schema, dict or string), regex, choice (a list of strings), grammar (EBNF),
    json_object (any JSON object) or structural_tag (xgrammar's structural tag, a JSON string).

    Checked here for shape only; whether the schema, regex or grammar is valid is checked when
    the request is added (folio/structured_output/), so a bad one fails only that request.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        kinds = [k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise SamplingParamsError(
                "structured_outputs",
                "structured_outputs must set exactly one of "
                f"{', '.join(STRUCTURED_OUTPUT_KINDS)}; got {', '.join(kinds) or 'none'}.",
            )
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                isinstance(c, str) for c in self.choice
            ):
                raise SamplingParamsError(
                    "structured_outputs", "structured_outputs.choice must be a non-empty list of strings."
                )
            self.choice = list(self.choice)
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise SamplingParamsError(
                    "structured_outputs", f"structured_outputs.{name} must be a non-empty string."
                )
        for name in ("json_object", "disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not (name == "json_object" and self.json_object is None):
                check_bool(f"structured_outputs.{name}", getattr(self, name), param="structured_outputs")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise SamplingParamsError(
                "structured_outputs", "structured_outputs.json must be a JSON schema (dict or string)."
            )
        if self.whitespace_pattern is not None:
            # Neither backend folio runs takes a whitespace regex: refuse rather than ignore it.
            raise SamplingParamsError(
                "structured_outputs",
                "structured_outputs.whitespace_pattern is not supported; use disable_any_whitespace.",
            )

    @property
    def kind(self) -> str:
        """Which constraint this is: one of STRUCTURED_OUTPUT_KINDS."""
        return next(k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) not in (None, False))

    @classmethod
    def from_value(cls, value: Any) -> StructuredOutputsParams:
        """Accept the params object or its dict form (a request body, vLLM's guided_decoding)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise SamplingParamsError(
                "structured_outputs", "structured_outputs must be an object of constraint fields."
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise SamplingParamsError(
                "structured_outputs", f"Unknown structured_outputs field(s): {', '.join(unknown)}."
            )
        return cls(**value)


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: dict[str, Any] | None = None
    # vLLM's: words never generated (each as token sequences, with and without a leading space)
    bad_words: list[str] | None = None
    # vLLM's callables: (output_token_ids, logits) -> logits, or (prompt_token_ids,
    # output_token_ids, logits) -> logits, on one row's float32 logits [vocab]; offline only.
    logits_processors: list[Callable[..., Any]] | None = None
    # Keep only the prompt's last k tokens (-1: the last max_model_len).
    truncate_prompt_tokens: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's older name for structured_outputs (a params object or its dict), folded into it.
    guided_decoding: InitVar[StructuredOutputsParams | dict[str, Any] | None] = None
    # Filled by the engine, not by users: EOS ids of the model plus stop_token_ids.
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # Filled by the engine from bad_words (update_from_tokenizer).
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    # The best_of that verify() derived from n (None: best_of was given): kept to follow n.
    _best_of_from_n: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self, guided_decoding: Any = None) -> None:
        if guided_decoding is not None:
            if self.structured_outputs is not None:
                raise SamplingParamsError(
                    "guided_decoding", "Set structured_outputs or guided_decoding, not both."
                )
            self.structured_outputs = guided_decoding
        self.verify()
        self._all_stop_token_ids = set(self.stop_token_ids)

    def verify(self) -> None:
        """Normalize and check every field, as at construction. The engine calls it again when a
        request is added, since fields may be set after construction (`sp.n = 3`). Idempotent,
        and linear in the fields (and their lists): cheap enough for every request."""
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_value(self.structured_outputs)
        self.stop = normalize_stop(self.stop)
        self.stop_token_ids = normalize_token_list("stop_token_ids", self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = normalize_token_list(
                "allowed_token_ids", self.allowed_token_ids
            )
        if self.top_k == -1:
            self.top_k = 0
        if self.best_of is None or self.best_of == self._best_of_from_n:
            # A best_of left unset follows n, also when n is changed after construction.
            self.best_of = self._best_of_from_n = self.n
        self._verify()
        if self.temperature < GREEDY_EPS:
            # Greedy: the other truncations cannot change an argmax.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    # ---- validation -------------------------------------------------------------------------
    def _verify(self) -> None:
        check_int("n", self.n, minimum=1)
        check_int("best_of", self.best_of, minimum=self.n, what=f"at least n ({self.n})")
        check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise SamplingParamsError(
                "repetition_penalty",
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.",
            )
        check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise SamplingParamsError(
                "temperature", f"temperature must be non-negative, got {self.temperature}."
            )
        check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError("top_p", f"top_p must be in (0, 1], got {self.top_p}.")
        check_int("top_k", self.top_k, minimum=0, what="-1, 0 (disabled) or a positive integer")
        check_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            # What torch.Generator.manual_seed accepts; beyond it the engine would fail mid-step.
            check_int("seed", self.seed, minimum=-(2**63))
            if self.seed >= 2**64:
                raise SamplingParamsError("seed", f"seed must be less than 2**64, got {self.seed}.")
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, minimum=1)
        check_int("min_tokens", self.min_tokens, minimum=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens",
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.",
            )
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, minimum=0)
        if self.prompt_logprobs is not None:
            check_int("prompt_logprobs", self.prompt_logprobs, minimum=0)
        for tok in self.stop_token_ids:
            check_int("stop_token_ids", tok, minimum=0, what="non-negative token ids")
        if self.logit_bias is not None:
            self.logit_bias = normalize_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise SamplingParamsError("allowed_token_ids", "allowed_token_ids must not be empty.")
            for tok in self.allowed_token_ids:
                check_int("allowed_token_ids", tok, minimum=0, what="non-negative token ids")
        if not isinstance(self.output_kind, RequestOutputKind):
            self.output_kind = _output_kind(self.output_kind)
        self._verify_vllm_extras()

    def _verify_vllm_extras(self) -> None:
        for name in ("ignore_eos", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            check_bool(name, getattr(self, name))
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise SamplingParamsError("extra_args", f"extra_args must be a dict, got {type(self.extra_args).__name__}.")
        if self.stop and not self.detokenize:  # matched on the text, which is then never made
            raise SamplingParamsError("stop", "stop strings need detokenize=True (they are matched on the "
                                              "output text); use stop_token_ids with detokenize=False.")
        if self.bad_words is not None:
            if isinstance(self.bad_words, str) or not isinstance(self.bad_words, (list, tuple)) or not all(
                isinstance(w, str) and w.strip() for w in self.bad_words
            ):
                raise SamplingParamsError("bad_words", "bad_words must be a list of non-blank strings.")
            self.bad_words = list(self.bad_words)
        if self.logits_processors is not None:
            if not isinstance(self.logits_processors, (list, tuple)):
                raise SamplingParamsError("logits_processors", "logits_processors must be a list of callables.")
            self.logits_processors = list(self.logits_processors)
            for proc in self.logits_processors:
                logits_processor_arity(proc)
        if self.truncate_prompt_tokens is not None:
            check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, minimum=-1,
                       what="-1 (the model's context) or a positive integer")
            if self.truncate_prompt_tokens == 0:
                raise SamplingParamsError(
                    "truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or a positive integer, got 0."
                )

    # ---- helpers ----------------------------------------------------------------------------
    @property
    def sampling_type_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    def update_from_model(self, eos_token_ids: set[int]) -> None:
        """Record the model's EOS ids: they stop the request unless ignore_eos is set."""
        self._all_stop_token_ids = set(self.stop_token_ids)
        if not self.ignore_eos:
            self._all_stop_token_ids |= set(eos_token_ids)

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Token sequences of bad_words, as vLLM makes them: each word as written without a
        leading space, and with one where that gives a different sequence of the same length."""
        self._bad_words_token_ids = []
        for word in self.bad_words or []:
            for prefix_space in (False, True):
                text = (" " if prefix_space else "") + word.lstrip()
                ids = list(tokenizer.encode(text, add_special_tokens=False))
                if not ids:
                    continue
                previous = self._bad_words_token_ids[-1] if self._bad_words_token_ids else None
                if prefix_space and previous is not None and (ids[0] == previous[0] or len(ids) != len(previous)):
                    continue
                self._bad_words_token_ids.append(ids)

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        return self._bad_words_token_ids

    def truncated_prompt(self, token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's last truncate_prompt_tokens tokens (all of them when unset)."""
        k = self.truncate_prompt_tokens
        if k is None:
            return token_ids
        return token_ids[-(max_model_len if k == -1 else k):]

    def clone(self) -> SamplingParams:
        # Logits processors may hold state or tensors: clones share them, as in vLLM.
        memo = {id(proc): proc for proc in self.logits_processors or []}
        return copy.deepcopy(self, memo)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


@dataclass(frozen=True)
class BeamSearchParams:
    """Beam search settings, with vLLM's names and import path (`LLM.beam_search`)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    # folio's: the text of each beam as a sampled request's (SamplingParams' defaults)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    @property
    def n(self) -> int:
        """Sequences the search keeps (what the server counts against its waiting limit)."""
        return self.beam_width

    def __post_init__(self) -> None:
        check_int("beam_width", self.beam_width, minimum=1)
        check_int("max_tokens", self.max_tokens, minimum=1)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens"):
            check_bool(name, getattr(self, name))  # "no" would read as True
        check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise SamplingParamsError(
                "temperature", f"temperature must be non-negative, got {self.temperature}."
            )
        if self.temperature != 0:
            _warn_beam_temperature()
        # Scores are log-prob / length ** length_penalty: beyond ±10 the power overflows (or
        # reaches 0) for long beams, and no ranking needs more.
        check_range("length_penalty", self.length_penalty, -MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY)


def _output_kind(value: Any) -> RequestOutputKind:
    """A RequestOutputKind from its int value (not a bool: True would read as DELTA)."""
    if not isinstance(value, bool) and isinstance(value, int):
        try:
            return RequestOutputKind(value)
        except ValueError:
            pass
    kinds = ", ".join(f"{k.name} ({k.value})" for k in RequestOutputKind)
    raise SamplingParamsError("output_kind", f"output_kind must be a RequestOutputKind: {kinds}; got {value!r}.")


@functools.cache
def _warn_beam_temperature() -> None:
    # vLLM v1 ranks beams by the model's raw log-probs too (its default logprobs mode), so it is
    # accepted for compatibility; warned once per process, not once per request.
    logger.warning("BeamSearchParams.temperature has no effect: beam search ranks the model's raw "
                   "log-probs, so it is deterministic whatever the temperature.")
