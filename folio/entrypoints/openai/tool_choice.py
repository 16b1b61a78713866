"""ToolChoice planning: what a chat request's tools and tool_choice make the engine and the
output parser do.

- "none" (or no tools): plain text.
- named function: the output is constrained to that function's parameters schema; the whole
  output is the call's arguments.
- "required": the output is constrained to a JSON list of {"name", "parameters"} objects, one
  of the tools' names each, with that tool's parameters; at least one call.
- "auto": free text, which the server's --tool-call-parser reads for the model's own
  tool-call format (a 400 when the server has none, as in vLLM); with parallel_tool_calls=false
  only the first call is returned, as vLLM does.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from folio.entrypoints.openai.errors import BadRequestError
from folio.entrypoints.openai.protocol.tools import NamedToolChoice, ToolDefinition
from folio.entrypoints.openai.tool_parsers import ParsedCall, ToolParser
from folio.sampling_params import SamplingParams, SamplingParamsError, StructuredOutputsParams
from folio.structured_output.spec import parse_json_schema

# A function with no parameters schema takes any JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "none" | "auto" | "required" | "named"
    schema: dict[str, Any] | None = None  # the JSON schema the output is constrained to
    function_name: str | None = None  # "named": the one function
    parser: ToolParser | None = None  # "auto": reads the model's own format
    parallel: bool = True  # "auto": False keeps the first call only (parallel_tool_calls=false, as vLLM)

    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        """(content, complete calls) of the text so far; see tool_parsers/base.py."""
        if self.mode == "named":
            return "", [ParsedCall(self.function_name or "", text)]
        if self.mode == "required":
            calls, end = required_calls(text)
            # An output cut short (max_tokens) ends inside the list: its unfinished part becomes
            # the content when the output is final, so nothing generated is lost.
            rest = text[end:].strip(" \t\r\n,") if final else ""
            return (text[end:].lstrip(" \t\r\n,") if rest and rest != "]" else ""), calls
        if self.mode == "auto" and self.parser is not None:
            content, calls = self.parser.parse(text, final)
            return content, calls if self.parallel else calls[:1]
        return text, []


def plan_tools(
    tools: list[ToolDefinition] | None,
    tool_choice: Any,
    parser: ToolParser | None,
    parallel_tool_calls: bool | None = True,
) -> ToolPlan:
    """The plan for a request; BadRequestError for an unknown tool name, a bad parameters
    schema, or "auto" on a server without a tool-call parser."""
    tools = tools or []
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice != "none" and not tools:
        raise BadRequestError("tool_choice needs tools.", param="tool_choice")
    repeated = sorted(name for name, count in Counter(t.function.name for t in tools).items() if count > 1)
    if repeated:  # a dict of schemas would keep one definition and drop the other without a word
        raise BadRequestError(f"tools: function name {repeated[0]!r} is defined more than once; names must "
                              "be unique.", param="tools")
    schemas = {t.function.name: _parameters(t) for t in tools}
    if tool_choice == "none":
        return ToolPlan("none")
    if tool_choice == "auto":
        if parser is None:
            raise BadRequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set.',
                param="tool_choice",
            )
        return ToolPlan("auto", parser=parser, parallel=parallel_tool_calls is not False)
    if tool_choice == "required":
        schema = required_schema(schemas, parallel_tool_calls is not False)
        try:  # the list of calls nests each tool's schema a few levels deeper (spec.MAX_SCHEMA_DEPTH)
            parse_json_schema(schema)
        except SamplingParamsError as e:
            raise BadRequestError(f"tools: {e}", param="tools") from None
        return ToolPlan("required", schema=schema)
    assert isinstance(tool_choice, NamedToolChoice)
    name = tool_choice.function.name
    if name not in schemas:
        raise BadRequestError(f"tool_choice names {name!r}, which is not in tools.", param="tool_choice")
    return ToolPlan("named", schema=schemas[name], function_name=name)


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    schema = tool.function.parameters or ANY_OBJECT
    try:
        parse_json_schema(schema)
    except SamplingParamsError as e:
        raise BadRequestError(f"tools: function {tool.function.name!r}: {e}", param="tools") from None
    return schema


def required_schema(schemas: dict[str, dict[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """A non-empty JSON list of calls, each {"name": one tool's name, "parameters": its schema};
    one call at most unless parallel."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, schema in schemas.items()
    ]
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def constrain_to_tools(params: Any, plan: ToolPlan) -> Any:
    """The request's SamplingParams, constrained to the plan's schema when it has one."""
    if plan.schema is None:
        return params
    if not isinstance(params, SamplingParams):
        raise BadRequestError('tool_choice "required" or a named function cannot be used with use_beam_search.', param="tool_choice")
    if params.structured_outputs is not None:
        raise BadRequestError(
            'tool_choice "required" or a named function constrains the output already; drop response_format '
            "/ structured_outputs.",
            param="tool_choice",
        )
    params.structured_outputs = StructuredOutputsParams(json=plan.schema)
    return params


def required_calls(text: str) -> tuple[list[ParsedCall], int]:
    """The complete calls at the start of a (possibly unfinished) JSON list of calls, and where
    the text after them starts (0 when no item is complete)."""
    calls = []
    items, end = complete_list_items(text)
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            calls.append(ParsedCall(item["name"], json.dumps(item.get("parameters", {}), ensure_ascii=False)))
    return calls, end if items else 0


def complete_list_items(text: str) -> tuple[list[Any], int]:
    """The items of a JSON list whose text is complete so far (the list may still be open), and
    the end of the last one (of the "[" before the first)."""
    decoder = json.JSONDecoder()
    pos = text.find("[")
    if pos < 0:
        return [], 0
    pos += 1
    items, end = [], pos
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items, end
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items, end
        items.append(item)
        end = pos
