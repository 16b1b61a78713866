"""The structured-output fields of a request body: OpenAI's response_format, vLLM's
structured_outputs object and its older guided_* aliases, folded into StructuredOutputsParams."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from folio.entrypoints.openai.protocol.unsupported import NestedRequestModel
from folio.sampling_params import SamplingParamsError, StructuredOutputsParams


class JsonSchemaFormat(NestedRequestModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)
    name: str = "response"
    description: str | None = None
    # "schema" shadows a pydantic BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(NestedRequestModel):
    """OpenAI's response_format: text, json_object, or json_schema with its schema."""
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # vLLM's structural_tag format: the tag object itself (passed to the backend as JSON).
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None


class StructuredOutputFields(BaseModel):
    """Mixed into completion and chat requests."""

    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The one constraint the body asks for, or None; SamplingParamsError naming the field
        when two fields ask for one each, or the one asked for is malformed."""
        asked = [(name, value) for name, value in self._constraints() if value is not None]
        if len(asked) > 1:
            names = ", ".join(name for name, _ in asked)
            raise SamplingParamsError(asked[1][0], f"Only one structured output constraint per request; got {names}.")
        if not asked:
            return None
        name, value = asked[0]
        try:
            return StructuredOutputsParams.from_value(value)
        except SamplingParamsError as e:
            raise SamplingParamsError(name, str(e)) from None

    def _constraints(self) -> list[tuple[str, dict[str, Any] | None]]:
        guided = {
            "json": self.guided_json,
            "regex": self.guided_regex,
            "choice": self.guided_choice,
            "grammar": self.guided_grammar,
        }
        guided_set = {k: v for k, v in guided.items() if v is not None}
        if self.guided_whitespace_pattern is not None:
            guided_set["whitespace_pattern"] = self.guided_whitespace_pattern
        if guided_set and len([k for k in guided_set if k != "whitespace_pattern"]) > 1:
            raise SamplingParamsError("guided_json", f"Set one guided_* field, got {', '.join(sorted(guided_set))}.")
        return [
            ("response_format", _from_response_format(self.response_format)),
            ("structured_outputs", self.structured_outputs),
            ("guided_" + next(iter(guided_set)) if guided_set else "guided_json", guided_set or None),
        ]


def _from_response_format(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    if fmt is None:
        return None
    unused = [name for name in ("json_schema", "structures", "triggers", "format")
              if getattr(fmt, name) is not None and not _used_by(fmt.type, name)]
    if unused:  # a schema sent with type "json_object" or "text" would be dropped unenforced
        raise SamplingParamsError("response_format", f'response_format of type "{fmt.type}" does not use '
                                  f"{', '.join(unused)}; send type \"json_schema\" for a schema.")
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "structural_tag":
        import json

        tag = fmt.model_dump(exclude_none=True, exclude={"json_schema"})
        return {"structural_tag": json.dumps(tag)}
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise SamplingParamsError("response_format", 'response_format of type "json_schema" needs json_schema.schema.')
    return {"json": fmt.json_schema.json_schema}


def _used_by(kind: str, name: str) -> bool:
    """Whether response_format's field `name` means something for its type."""
    return (kind == "json_schema" and name == "json_schema") or (
        kind == "structural_tag" and name in ("structures", "triggers", "format"))
