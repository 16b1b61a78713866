"""Request fields folio knows and cannot honour, and the log line for fields it does not know.

A known OpenAI field set to anything but its neutral value is a 400 naming it (never silently
dropped). A field no request model declares is logged, as vLLM logs it ("fields were present in
the request but ignored"), and the request goes on: clients send fields from newer API versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

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


def log_ignored_fields(model: type[BaseModel], data: Any, where: str | None = None) -> None:
    if not isinstance(data, dict):
        return
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    ignored = sorted(set(data) - known)
    if ignored:
        logger.warning("The following fields were present in the request but ignored: %s%s", ignored,
                       f" (in {where})" if where else "")


class NestedRequestModel(BaseModel):
    """A part of a request body (response_format, a tool): strict JSON types, and unknown fields
    ignored but logged with where they were, as at the top level (a review found them dropped
    without a word)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _log_ignored_fields(cls, data: Any) -> Any:
        log_ignored_fields(cls, data, where=cls.__name__)
        return data


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
