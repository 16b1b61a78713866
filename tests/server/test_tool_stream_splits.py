"""Tool-call and reasoning parsing of realistic model outputs, whole and streamed in every split:
the deltas, accumulated the way the openai client accumulates them (arguments appended per
index; id, type and name once, on the call's first delta), must equal the whole-text parse, and
no text may be lost or duplicated between reasoning_content, content and tool_calls."""

from __future__ import annotations

import json

import pytest

from folio.entrypoints.openai.chat_message import ChatOutputParser, MessageStreamer
from folio.entrypoints.openai.protocol.tools import ToolDefinition
from folio.entrypoints.openai.reasoning_parsers import get_reasoning_parser
from folio.entrypoints.openai.serving_chat import _finish_reason
from folio.entrypoints.openai.tool_choice import ToolPlan, plan_tools
from folio.entrypoints.openai.tool_parsers import get_tool_parser

ARGS = '{"city": "Oslo \\"Nord\\" {1}", "tags": ["a]", "}"], "u": "\\u00e9\\ud83d\\ude00", "n": {"x": null}}'
ARGS_OUT = json.dumps(json.loads(ARGS), ensure_ascii=False)  # as the server writes them
H = '<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + '}\n</tool_call>'
H2 = '<tool_call>{"name": "set_alarm", "arguments": {"hour": 7}}</tool_call>'
W, A = ("get_weather", ARGS_OUT), ("set_alarm", '{"hour": 7}')

CASES = [
    # tool parser, reasoning parser, model output, reasoning_content, content, calls
    ("hermes", None, "Sure, let me look. " + H, "", "Sure, let me look. ", [W]),
    ("hermes", None, H + "\n" + H2, "", "", [W, A]),
    # text after and between the calls is content (it was dropped, streamed or not)
    ("hermes", None, "Sure. " + H + " Anything else? 日本🙂", "", "Sure.  Anything else? 日本🙂", [W]),
    ("hermes", None, "A " + H2 + " B " + H2 + " C", "", "A  B  C", [A, A]),
    # a second call cut off by max_tokens, or broken, stays in content (it was dropped)
    ("hermes", None, H + H2[:30], "", H2[:30], [W]),
    ("hermes", None, H2 + "<tool_call>{broken}</tool_call>", "", "<tool_call>{broken}</tool_call>", [A]),
    ("hermes", None, "<tool_call>{broken}</tool_call>" + H2, "", "<tool_call>{broken}</tool_call>" + H2, []),
    # the closing tag inside a string argument (the tag was searched for, and cut the JSON)
    ("hermes", None, '<tool_call>{"name": "set_alarm", "arguments": {"note": "</tool_call>"}}</tool_call>', "", "",
     [("set_alarm", '{"note": "</tool_call>"}')]),
    ("hermes", None, "Just words, a < b.", "", "Just words, a < b.", []),
    ("hermes", None, "cut <tool_ca", "", "cut <tool_ca", []),
    ("hermes", "qwen3", "<think>\nUse <tool_call> here?\n</think>\n\nOK. " + H + "\n", "\nUse <tool_call> here?\n", "OK. ", [W]),
    ("hermes", "qwen3", "<think>never closed " + H2, "never closed " + H2, "", []),
    ("hermes", "deepseek_r1", "thinking</think>" + H2, "thinking", "", [A]),
    ("llama3_json", None, '{"name": "get_weather", "parameters": ' + ARGS + "}", "", "", [W]),
    ("llama3_json", None, '<|python_tag|>{"name": "set_alarm", "parameters": {"hour": 7}}; {"name": "get_weather", "parameters": ' + ARGS + "}", "", "", [A, W]),
    # a call that was streamed stays a call (the whole-text parse dropped it to content)
    ("llama3_json", None, '{"name": "set_alarm", "parameters": {"hour": 7}} Hope that helps.', "", "Hope that helps.", [A]),
    ("llama3_json", None, '{"name": "set_alarm", "parameters": {"hour": 7}}; {"name": "get_wea', "", '{"name": "get_wea', [A]),
    ("llama3_json", None, '{"name": "set_alarm", "parameters": {"hour": 7}}; {"not": "a call"}', "", '{"not": "a call"}', [A]),
    ("llama3_json", None, '{"not": "a call"}', "", '{"not": "a call"}', []),
    ("mistral", None, 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": ' + ARGS + '}, {"name": "set_alarm", "arguments": {"hour": 7}}]', "", "Checking.", [W, A]),
    ("mistral", None, 'Checking.[TOOL_CALLS][{"name": "set_alarm", "arguments": {"hour": 7}}] Done.', "", "Checking. Done.", [A]),
    ("mistral", None, '[TOOL_CALLS][{"name": "set_alarm", "arguments": {"hour": 7}}][TOOL_CALLS][{"name": "set_alarm", "arguments": {"hour": 7}}]', "", "", [A, A]),
    # the v11+ tokenizers' format: [TOOL_CALLS]name[ARGS]{...} ([ARGS] kept or not)
    ("mistral", None, '[TOOL_CALLS]get_weather[ARGS]' + ARGS + '[TOOL_CALLS]set_alarm[ARGS]{"hour": 7}', "", "", [W, A]),
    ("mistral", None, 'On it.[TOOL_CALLS]get_weather' + ARGS + '[TOOL_CALLS]set_alarm{"hour": 7}', "", "On it.", [W, A]),
    ("mistral", None, '[TOOL_CALLS]get weather{"x": 1}', "", '[TOOL_CALLS]get weather{"x": 1}', []),
    ("mistral", None, '[TOOL_CALLS][{"name": "set_alarm", "argu', "", '[TOOL_CALLS][{"name": "set_alarm", "argu', []),
    ("mistral", None, "Plain [TOOL text", "", "Plain [TOOL text", []),
    (None, "qwen3", "<think>a</thi", "a</thi", "", []),
    (None, "deepseek_r1", "\n\nall thought, no end", "all thought, no end", "", []),
]


def _parser(tool: str | None, reasoning: str | None) -> ChatOutputParser:
    plan = ToolPlan("auto", parser=get_tool_parser(tool)) if tool else ToolPlan("none")
    return ChatOutputParser(plan, get_reasoning_parser(reasoning) if reasoning else None)


def _whole(parser: ChatOutputParser, text: str):
    parsed = parser.parse(text, final=True)
    return parsed.reasoning or "", parsed.content, [(c.name, c.arguments) for c in parsed.calls]


def _streamed(parser: ChatOutputParser, chunks: list[str]):
    """What a client holds after the stream: the openai client's accumulation, checked."""
    streamer = MessageStreamer(parser)
    reasoning = content = ""
    calls: dict[int, dict] = {}
    for i, chunk in enumerate(chunks):
        delta = streamer.feed(chunk, final=i == len(chunks) - 1)
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for d in delta.tool_calls or []:
            first = d.index not in calls
            assert first == (d.index == len(calls)), "tool call indexes count up from 0"
            assert first == (d.id is not None) == (d.type == "function") == (d.function.name is not None)
            call = calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})
            call["arguments"] += d.function.arguments or ""
    return reasoning, content, [(c["name"], c["arguments"]) for c in calls.values()]


def _splits(text: str):
    yield list(text)  # a character at a time
    for k in range(1, len(text)):
        yield [text[:k], text[k:]]
    step = max(1, len(text) // 12)
    for a in range(1, len(text), step):
        for b in range(a + 1, len(text), step):
            yield [text[:a], text[a:b], text[b:]]


@pytest.mark.parametrize("tool, reasoning, text, want_reasoning, want_content, want_calls", CASES)
def test_every_split_streams_what_the_whole_text_parses_to(tool, reasoning, text, want_reasoning, want_content, want_calls):
    parser = _parser(tool, reasoning)
    whole = _whole(parser, text)
    assert whole == (want_reasoning, want_content, want_calls)
    for name, arguments in whole[2]:
        assert isinstance(json.loads(arguments), dict)
    for chunks in _splits(text):
        assert _streamed(parser, chunks) == whole, chunks


@pytest.mark.parametrize("tool, text", [
    ("hermes", H + H2),
    ("llama3_json", '{"name": "get_weather", "parameters": ' + ARGS + '}; {"name": "set_alarm", "parameters": {"hour": 7}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + ARGS + '}, {"name": "set_alarm", "arguments": {"hour": 7}}]'),
])
def test_parallel_tool_calls_false_keeps_the_first_call_streamed_or_not(tool, text):
    """vLLM honours parallel_tool_calls=false under "auto" by returning the first call only;
    folio returned every call."""
    tools = [ToolDefinition.model_validate({"type": "function", "function": {"name": n}}) for n in ("get_weather", "set_alarm")]
    plan = plan_tools(tools, "auto", get_tool_parser(tool), parallel_tool_calls=False)
    parser = ChatOutputParser(plan, None)
    assert _whole(parser, text) == ("", "", [W])
    for chunks in _splits(text):
        assert _streamed(parser, chunks) == ("", "", [W])
    assert _whole(_parser(tool, None), text)[2] == [W, A]


@pytest.mark.parametrize("reason, made_calls, named, want", [
    ("stop", True, False, "tool_calls"),
    ("stop", False, False, "stop"),
    ("length", True, False, "length"),  # cut short: the client must not take the calls as all
    ("stop", True, True, "stop"),  # a named (forced) call finishes with "stop", as in vLLM and OpenAI
    (None, True, False, None),
])
def test_finish_reason(reason, made_calls, named, want):
    assert _finish_reason(reason, made_calls, named) == want


OPENED = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"  # Qwen3 thinking / Qwen3.5
CLOSED = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking=False


@pytest.mark.parametrize("prompt, text, want", [
    # the prompt opened <think>: the output starts inside it (it was all content, "</think>" too)
    (OPENED, "Let me see.\n</think>\n\nThe answer. " + H2, ("Let me see.\n", "The answer. ", [A])),
    (OPENED, "<think>again</think>Answer", ("again", "Answer", [])),
    (OPENED, "cut short by max_tokens", ("cut short by max_tokens", "", [])),
    (CLOSED, "The answer. " + H2, ("", "The answer. ", [A])),
    ("", "Let me see.</think>Answer", ("", "Let me see.</think>Answer", [])),
])
def test_a_prompt_that_opens_think_makes_the_output_reasoning_first(prompt, text, want):
    parser = ChatOutputParser(ToolPlan("auto", parser=get_tool_parser("hermes")), get_reasoning_parser("qwen3"), prompt)
    assert _whole(parser, text) == want
    for chunks in _splits(text):
        assert _streamed(parser, chunks) == want, chunks
