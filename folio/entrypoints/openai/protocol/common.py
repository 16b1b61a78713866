"""Shapes shared by every endpoint: errors, usage, models, and the sampling fields of a request.

Request models ignore fields they do not know (OpenAI adds fields often; clients send them).
The bounds declared here put SamplingParams' simple limits into the OpenAPI schema, so clients
and fuzzers see them; SamplingParams stays the authority (NaN, infinities, min_tokens against
max_tokens, token ids against the vocabulary) and its errors name the field too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, ValidationError, model_validator

from folio.entrypoints.openai.protocol.structured import StructuredOutputFields
from folio.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, SamplingParamsError

# OpenAI's own cap on choices per request; it also bounds the work one request can ask for.
MAX_N = 128

TokenId = Annotated[int, Field(ge=0)]

_PROMPT_KINDS = ("string", "token id", "token-id list")


def prompt_problem(value: Any, name: str) -> str | None:
    """What is wrong, in words, with a prompt (or embedding input) the type union refused:
    pydantic names only its first branch's error ("Input should be a valid string (and 3 more
    problems)"), which hides a negative id or an empty string. None when nothing specific."""
    shapes = "a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        return f"{name} must not be empty." if not value else None
    if not isinstance(value, list):
        return f"{name} must be {shapes}, got {type(value).__name__}."
    if not value:
        return f"{name} must not be empty."
    kinds = sorted({_kind(v) for v in value})
    if len(kinds) > 1:
        return f"{name} mixes {' and '.join(kinds)}: a list holds one kind ({shapes})."
    for i, item in enumerate(value):
        if kinds[0] not in _PROMPT_KINDS:
            return f"{name}[{i}] must be a string, a token id or a list of token ids, got {item!r}."
        if kinds[0] == "string" and not item:
            return f"{name}[{i}] is an empty string."
        if kinds[0] == "token id" and item < 0:
            return f"{name}[{i}] is a negative token id ({item})."
        if kinds[0] == "token-id list":
            if not item:
                return f"{name}[{i}] is an empty list."
            for j, token in enumerate(item):
                if _kind(token) != "token id" or token < 0:
                    return f"{name}[{i}][{j}] must be a token id (a non-negative integer), got {token!r}."
    return None


def prompt_in_words(handler: Any, value: Any, name: str) -> Any:
    """A wrap validator's body: the union's result, or its failure said in words (prompt_problem)."""
    try:
        return handler(value)
    except ValidationError:
        problem = prompt_problem(value, name)
        if problem is None:
            raise
        raise ValueError(problem) from None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "token id", str: "string", list: "token-id list"}.get(type(value), type(value).__name__)


class OpenAIBaseModel(BaseModel):
    """A request body. Strict: JSON types as declared (false is not 0, "1" is not 1); numbers
    finite (NaN is "not a finite number", not "should be >= 0")."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    @model_validator(mode="wrap")
    @classmethod
    def _log_ignored_fields(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        """Unknown fields are ignored, and logged once the request is taken (protocol/unsupported.py)."""
        from folio.entrypoints.openai.protocol.unsupported import validate_logging_ignored

        return validate_logging_ignored(cls, data, handler)


# ---- errors -----------------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- usage ------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False


# ---- models -----------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "folio"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- misc -------------------------------------------------------------------------------------


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class VersionResponse(BaseModel):
    version: str


# ---- the sampling part of a request -----------------------------------------------------------


# Fields beam search does not take, with their neutral values (a 400 naming the field when set
# to anything else; `seed` is accepted and unused: beam search draws nothing at random).
_NOT_WITH_BEAMS: dict[str, tuple[Any, ...]] = {
    "stop": (None, "", []),
    "stop_token_ids": (None, []),
    "top_p": (None, 1.0),
    "top_k": (None, -1, 0),
    "min_p": (None, 0.0),
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "logit_bias": (None, {}),
    "min_tokens": (0,),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
}


class SamplingRequest(OpenAIBaseModel, StructuredOutputFields):
    """Fields that completions and chat share: OpenAI's, then vLLM's extras (structured outputs:
    protocol/structured.py)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    priority: int = 0
    use_beam_search: bool = False  # n beams, deterministic (vLLM's extra)
    length_penalty: float = 1.0  # beam search: scores are log-prob / length ** length_penalty
    # Prefix caching: requests share cached K/V only with requests of the same salt (or none).
    cache_salt: str | None = Field(default=None, min_length=1)
    bad_words: list[Annotated[str, Field(min_length=1)]] | None = None
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)  # keep the last k (-1: context)

    def to_beam_search_params(self, max_tokens: int) -> BeamSearchParams:
        """BeamSearchParams for `use_beam_search`: n beams; one output when the search ends."""
        for name, neutral in _NOT_WITH_BEAMS.items():
            if getattr(self, name) not in neutral:
                raise SamplingParamsError(name, f"{name} cannot be used with use_beam_search.")
        if self.structured_outputs_params() is not None:
            raise SamplingParamsError("use_beam_search", "Structured outputs cannot be used with use_beam_search.")
        return BeamSearchParams(
            beam_width=self.n,
            max_tokens=max_tokens,
            ignore_eos=self.ignore_eos,
            temperature=self.temperature or 0.0,
            length_penalty=self.length_penalty,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def to_sampling_params(
        self,
        max_tokens: int,
        defaults: SamplingParams,
        *,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """SamplingParams for this request; fields left out take the model's defaults.

        Raises SamplingParamsError naming the offending field.
        """
        if self.length_penalty != 1.0:  # not silently dropped: it scores beams only
            raise SamplingParamsError("length_penalty", "length_penalty applies to beam search only; "
                                      "set use_beam_search, or leave length_penalty at 1.")
        pick = _defaults_picker(self, defaults)
        return SamplingParams(
            n=self.n,
            max_tokens=max_tokens,
            temperature=pick("temperature"),
            top_p=pick("top_p"),
            top_k=pick("top_k"),
            min_p=pick("min_p"),
            repetition_penalty=pick("repetition_penalty"),
            presence_penalty=pick("presence_penalty"),
            frequency_penalty=pick("frequency_penalty"),
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            logit_bias=self.logit_bias,
            bad_words=self.bad_words,
            allowed_token_ids=self.allowed_token_ids,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
            structured_outputs=self.structured_outputs_params(),
        )

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def _defaults_picker(request: BaseModel, defaults: SamplingParams):
    def pick(name: str) -> Any:
        value = getattr(request, name)
        return getattr(defaults, name) if value is None else value

    return pick
