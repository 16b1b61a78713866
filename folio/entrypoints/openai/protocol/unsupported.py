"""Request fields folio knows and cannot honour, and the log line for fields it does not know.

A known OpenAI field set to anything but its neutral value is a 400 naming it (never silently
dropped). A field no request model declares is logged, as vLLM logs it ("fields were present in
the request but ignored"), and the request goes on: clients send fields from newer API versions.
The line is written only for a request that is taken: a model that fails validation (a union's
other branch too) drops its lines, and IgnoredFieldsLog holds a request's lines until its
response starts, dropping them for a 4xx or 5xx (a review found a refused tool_choice logged as
"ignored").
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ModelWrapValidatorHandler, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from folio.logger import init_logger

logger = init_logger("folio.entrypoints.openai.protocol")


@dataclass(frozen=True)
class Refused:
    """Marks a field folio cannot honour: the values it takes, and why (docs/vllm-compat.md)."""

    neutral: tuple[Any, ...]
    why: str


def unsupported(neutral: tuple[Any, ...], why: str) -> Any:
    """A field type that accepts only `neutral` values; any other is a 400 naming the field."""

    def check(value: Any) -> Any:
        if value not in neutral:
            raise ValueError(f"folio cannot honour this field ({why}); leave it out")
        return value

    return Annotated[Any, AfterValidator(check), Refused(neutral, why)]


def refused_fields(model: type[BaseModel]) -> dict[str, Refused]:
    """The model's fields declared with unsupported(), by name."""
    return {
        name: marker
        for name, info in model.model_fields.items()
        for marker in info.metadata
        if isinstance(marker, Refused)
    }


# The log lines of the model (or request) being validated, not yet written; None: write at once.
_pending: ContextVar[list[str] | None] = ContextVar("folio_ignored_fields", default=None)


def ignored_fields_line(model: type[BaseModel], data: Any, where: str | None = None) -> str | None:
    if not isinstance(data, dict):
        return None
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    ignored = sorted(set(data) - known)
    if not ignored:
        return None
    where = f" (in {where})" if where else ""
    return f"The following fields were present in the request but ignored: {ignored}{where}"


def validate_logging_ignored(model: type[BaseModel], data: Any, handler: ModelWrapValidatorHandler,
                             where: str | None = None) -> Any:
    """A wrap validator's body: the model validated, and its (and its parts') ignored-field lines
    passed on to the enclosing model or request only when it is valid."""
    lines: list[str] = []
    token = _pending.set(lines)
    try:
        line = ignored_fields_line(model, data, where)
        if line is not None:
            lines.append(line)
        result = handler(data)  # raises for an invalid model: its lines are dropped
    finally:
        _pending.reset(token)
    outer = _pending.get()
    if outer is None:
        _write(lines)
    else:
        outer.extend(lines)
    return result


def _write(lines: list[str]) -> None:
    for line in lines:
        logger.warning("%s", line)


class IgnoredFieldsLog:
    """Holds a request's ignored-field lines until its response starts: written when it is a
    success (streams included), dropped when the request was refused or failed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):  # no body
            await self.app(scope, receive, send)
            return
        lines: list[str] = []

        async def send_after_writing(message: Message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] < 400:
                    _write(lines)
                lines.clear()
            await send(message)

        token = _pending.set(lines)
        try:
            await self.app(scope, receive, send_after_writing)
        finally:
            _pending.reset(token)


class NestedRequestModel(BaseModel):
    """A part of a request body (response_format, a tool): strict JSON types, and unknown fields
    ignored but logged with where they were, as at the top level (a review found them dropped
    without a word)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _log_ignored_fields(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        return validate_logging_ignored(cls, data, handler, where=cls.__name__)


class UnsupportedChatFields(BaseModel):
    """OpenAI chat fields with no meaning in folio (text-only, no hosted tools, nothing stored)."""

    audio: unsupported((None,), "text output only") = None
    modalities: unsupported((None, ["text"]), "text output only") = None
    prediction: unsupported((None,), "no predicted outputs") = None
    web_search_options: unsupported((None,), "no web search") = None
    functions: unsupported((None,), "the legacy functions API; use tools") = None
    function_call: unsupported((None,), "the legacy functions API; use tool_choice") = None
    store: unsupported((None, False), "nothing is stored") = None
    service_tier: unsupported((None, "auto", "default"), "one service tier") = None
    # Accepted and unused, as in vLLM: they only tag requests.
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
