"""Tool-call and reasoning parsers on written-out model texts: whole, and streamed one character
at a time, where the deltas must add up to the whole-text parse."""

from __future__ import annotations

import json

import pytest

from folio.entrypoints.openai.chat_message import ChatOutputParser, MessageStreamer
from folio.entrypoints.openai.errors import BadRequestError
from folio.entrypoints.openai.protocol.tools import NamedToolChoice, ToolDefinition
from folio.entrypoints.openai.reasoning_parsers import get_reasoning_parser
from folio.entrypoints.openai.tool_choice import ToolPlan, plan_tools
from folio.entrypoints.openai.tool_parsers import ParsedCall, get_tool_parser

ARGS = {"city": "Oslo", "days": 3}
CASES = [
    # parser, text, content, calls
    ("hermes", 'Sure.<tool_call>{"name": "w", "arguments": {"city": "Oslo", "days": 3}}</tool_call>', "Sure.", [("w", ARGS)]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>', "", [("a", {}), ("b", {"x": 1})]),
    ("hermes", "No call, just <tool text.", "No call, just <tool text.", []),
    ("hermes", "<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
    ("llama3_json", '{"name": "w", "parameters": {"city": "Oslo", "days": 3}}', "", [("w", ARGS)]),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', "", [("a", {}), ("b", {"x": 1})]),
    ("llama3_json", "Hello there.", "Hello there.", []),
    ("llama3_json", '{"not": "a call"}', '{"not": "a call"}', []),
    ("mistral", 'Let me check.[TOOL_CALLS][{"name": "w", "arguments": {"city": "Oslo", "days": 3}}]', "Let me check.", [("w", ARGS)]),
    ("mistral", "Plain [TOOL text", "Plain [TOOL text", []),
]


def _calls(calls: list[ParsedCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_tool_parsers_whole_and_streamed(name, text, content, calls):
    plan = ToolPlan("auto", parser=get_tool_parser(name))
    parsed = ChatOutputParser(plan, None).parse(text, final=True)
    assert parsed.content == content and _calls(parsed.calls) == calls
    streamer = MessageStreamer(ChatOutputParser(plan, None))
    got_content, got_calls = "", {}
    for i, ch in enumerate(text):
        delta = streamer.feed(ch, final=i == len(text) - 1)
        got_content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = got_calls.setdefault(d.index, ["", ""])
            entry[0] += d.function.name or ""
            entry[1] += d.function.arguments or ""
    assert got_content == content
    assert [(n, json.loads(a)) for n, a in got_calls.values()] == calls


@pytest.mark.parametrize(
    "name, text, reasoning, content",
    [
        ("qwen3", "<think>\nhmm, so</think>\n\nThe answer.", "\nhmm, so", "The answer."),
        ("qwen3", "No thinking here.", None, "No thinking here."),
        ("qwen3", "<think>cut short", "cut short", ""),
        ("deepseek_r1", "implicit start</think>Answer", "implicit start", "Answer"),
        ("deepseek_r1", "<think>x</think>y", "x", "y"),
        ("deepseek_r1", "all thought", "all thought", ""),
    ],
)
def test_reasoning_parsers_whole_and_streamed(name, text, reasoning, content):
    parser = ChatOutputParser(ToolPlan("none"), get_reasoning_parser(name))
    parsed = parser.parse(text, final=True)
    assert (parsed.reasoning, parsed.content) == (reasoning, content)
    streamer = MessageStreamer(parser)
    got_r, got_c = "", ""
    for i, ch in enumerate(text):
        delta = streamer.feed(ch, final=i == len(text) - 1)
        got_r += delta.reasoning or ""
        got_c += delta.content or ""
    assert got_r == (reasoning or "") and got_c == content


@pytest.mark.parametrize("choice", ["none", "required", {"type": "function", "function": {"name": "f"}}])
def test_tools_with_one_name_twice_are_refused_whatever_the_choice(choice):
    """A dict of schemas by name kept the last definition and dropped the first without a word."""
    tools = [ToolDefinition.model_validate({"type": "function", "function": {"name": name, "parameters": params}})
             for name, params in (("f", {"type": "object"}), ("g", {}), ("f", {"type": "object", "required": ["a"]}))]
    if isinstance(choice, dict):
        choice = NamedToolChoice.model_validate(choice)
    with pytest.raises(BadRequestError, match="'f' is defined more than once") as error:
        plan_tools(tools, choice, None)
    assert error.value.param == "tools"


def test_plan_tools_errors_and_schemas():
    tools = [ToolDefinition.model_validate({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})]
    with pytest.raises(BadRequestError, match="enable-auto-tool-choice"):
        plan_tools(tools, "auto", None)
    with pytest.raises(BadRequestError, match="not in tools"):
        plan_tools(tools, NamedToolChoice.model_validate({"type": "function", "function": {"name": "g"}}), None)
    assert plan_tools(None, None, None).mode == "none"
    required = plan_tools(tools, "required", None, parallel_tool_calls=False)
    assert required.schema["maxItems"] == 1 and required.schema["minItems"] == 1
    assert _calls(required.parse('[{"name": "f", "parameters": {"a": 1}}, {"name": "f", "par', final=False)[1]) == [("f", {"a": 1})]
