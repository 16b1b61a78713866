"""Structured outputs, tool calls and reasoning through the HTTP server, driven by the official
openai client, on a tiny random checkpoint: what comes back must parse and validate, and bad
input must be a 400."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from openai import OpenAI

from folio.entrypoints.openai.cli_args import ServerConfig
from folio.demo.tokenizer import CHATML_TEMPLATE
from tests.helpers.checkpoints import make_tiny_checkpoint, tiny_model_dir
from tests.helpers.tokenizers import save_test_tokenizer
from tests.server.harness import ServerThread, make_engine

pytestmark = pytest.mark.slow

# ChatML that also renders the tools' names (the context is short), so their presence shows.
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\ntools: ' + (tools | map(attribute='function') | map(attribute='name')"
    " | join(', ')) + '<|im_end|>\\n' }}{%- endif %}\n" + CHATML_TEMPLATE
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "parameters": {
            "type": "object",
            "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "loud": {"type": "boolean"}},
            "required": ["hour", "loud"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory, "llama", "so-llama")
    engine = make_engine(path, max_model_len=512, structured_outputs_config={"disable_any_whitespace": True})
    config = ServerConfig(
        chat_template=TOOLS_TEMPLATE, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3"
    )
    with ServerThread(engine, config) as server, OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        yield c


def _chat(client, **kw):
    return client.chat.completions.create(**{"model": None, "messages": MESSAGES, "temperature": 1.0, "max_tokens": 300, **kw})


def _check_calls(calls):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in calls}) == len(calls)


def test_chat_json_schema_response_format(client):
    schema = SCHEMAS["get_weather"]
    r = _chat(client, n=3, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}})
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_completions_constraints_and_aliases(client):
    def complete(**extra):
        kw = dict(model=None, prompt="Say", max_tokens=200, temperature=1.0, n=3)
        return client.completions.create(**{**kw, **extra})

    for c in complete(extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,6} \d{2}"}}).choices:
        assert c.finish_reason == "stop" and re.fullmatch(r"[A-Z][a-z]{2,6} \d{2}", c.text)
    for c in complete(extra_body={"guided_choice": ["alpha", "beta"]}).choices:
        assert c.text in ("alpha", "beta")
    for c in complete(extra_body={"guided_json": SCHEMAS["set_alarm"]}).choices:
        jsonschema.validate(json.loads(c.text), SCHEMAS["set_alarm"])
    r = complete(extra_body={"response_format": {"type": "json_object"}}, max_tokens=400)
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)


def test_tool_choice_required_returns_valid_calls(client):
    r = _chat(client, n=3, tools=TOOLS, tool_choice="required")
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls)


def test_tool_choice_required_cut_short_keeps_the_unfinished_call_as_content(client):
    # max_tokens ends the list inside a call: nothing generated is dropped, streamed or not.
    r = _chat(client, n=2, tools=TOOLS, tool_choice="required", max_tokens=6)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       _chat(client, stream=True, tools=TOOLS, tool_choice="required", max_tokens=6))
    for choice in r.choices:
        assert choice.finish_reason == "length" and not choice.message.tool_calls
        assert choice.message.content and choice.message.content.startswith("[")
    assert streamed.startswith("[") and len(streamed) > 1


def test_tool_choice_named_and_tools_reach_the_template(client):
    named = {"type": "function", "function": {"name": "set_alarm"}}
    r = _chat(client, tools=TOOLS, tool_choice=named)
    (call,) = r.choices[0].message.tool_calls
    # OpenAI answers a forced (named) call with "stop", not "tool_calls"
    assert call.function.name == "set_alarm" and r.choices[0].finish_reason == "stop"
    _check_calls([call])
    plain = _chat(client, max_tokens=1)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 5  # the tools were rendered


def _stream_calls(client, **kw):
    """Accumulate streamed tool-call deltas the way OpenAI's clients do."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in _chat(client, stream=True, **kw):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function is not None:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
    return calls, finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_accumulate_to_valid_calls(client, tool_choice):
    calls, finish = _stream_calls(client, tools=TOOLS, tool_choice=tool_choice)
    assert finish == ("tool_calls" if tool_choice == "required" else "stop") and calls
    for call in calls.values():
        assert call["id"].startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_auto_tool_choice_parses_hermes_calls_and_reasoning(client):
    # The grammar makes the random model write a thought and a Hermes tool call; the parsers
    # must turn them into reasoning_content and tool_calls.
    grammar = (
        'root ::= "<think>" [a-z ]{1,12} "</think>" "<tool_call>{\\"name\\": \\"get_weather\\", '
        '\\"arguments\\": {\\"city\\": \\"Oslo\\", \\"days\\": " [1-7] "}}</tool_call>"'
    )
    r = _chat(client, tools=TOOLS, tool_choice="auto", extra_body={"structured_outputs": {"grammar": grammar}})
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert re.fullmatch(r"[a-z ]{1,12}", message.reasoning_content)
    _check_calls(message.tool_calls)
    calls, finish = _stream_calls(client, tools=TOOLS, tool_choice="auto", extra_body={"structured_outputs": {"grammar": grammar}})
    assert finish == "tool_calls" and [c["name"] for c in calls.values()] == ["get_weather"]


def test_streamed_reasoning_is_kept_out_of_content(client):
    regex = r"<think>[a-z]{3,10}</think>[A-Z][a-z]{2,5}"
    reasoning = content = ""
    for chunk in _chat(client, stream=True, extra_body={"structured_outputs": {"regex": regex}}):
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert re.fullmatch(r"[a-z]{3,10}", reasoning) and re.fullmatch(r"[A-Z][a-z]{2,5}", content)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}), "structured_outputs"),
        (dict(extra_body={"structured_outputs": {"regex": "(unclosed"}}), "structured_outputs"),
        (dict(extra_body={"guided_grammar": "root ::= missing"}), "structured_outputs"),
        (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}}), "structured_outputs"),
        (dict(extra_body={"guided_regex": "a", "structured_outputs": {"regex": "b"}}), None),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}], tool_choice="required"), "tools"),
        (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
        # a schema the type does not use would be dropped unenforced (found by a review)
        (dict(response_format={"type": "json_object", "json_schema": {"name": "x", "schema": {"type": "integer"}}}), "response_format"),
        (dict(response_format={"type": "text", "json_schema": {"name": "x", "schema": {"type": "integer"}}}), "response_format"),
    ],
)
def test_bad_constraints_are_400(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, **kwargs)
    if param is not None:
        assert info.value.body["param"] == param
    assert _chat(client, max_tokens=2).choices[0].finish_reason  # the server still serves


def test_a_constraint_nothing_satisfies_is_an_error_not_an_empty_stop(client):
    # Found by a review: these returned 200 with "" and finish_reason "stop".
    unsatisfiable = dict(extra_body={"structured_outputs": {"grammar": "root ::= root"}})
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, **unsatisfiable)
    assert "admits no output" in info.value.body["message"] and info.value.body["param"] == "structured_outputs"
    assert _chat(client, max_tokens=2).choices[0].finish_reason  # the server still serves


def test_engine_in_its_own_process_constrains_and_refuses_the_same(tmp_path):
    """`--engine-process` (the default on a GPU): params cross a process boundary."""
    path = str(tmp_path / "llama")
    make_tiny_checkpoint("llama", path)
    save_test_tokenizer(path)
    engine = make_engine(path, max_model_len=512, engine_process=True, structured_outputs_config={"disable_any_whitespace": True})
    with ServerThread(engine, ServerConfig(chat_template=TOOLS_TEMPLATE)) as server, OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        r = _chat(c, n=2, tools=TOOLS, tool_choice="required")
        for choice in r.choices:
            _check_calls(choice.message.tool_calls)
        with pytest.raises(openai.BadRequestError):
            _chat(c, extra_body={"structured_outputs": {"regex": "(("}})
