"""Tool calls and reasoning through a live server and the official openai client, on a tiny
random checkpoint (a grammar makes it write what a tool-calling model writes): the streamed
message, accumulated as the client does, must equal the whole one."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai import OpenAI

from folio.entrypoints.openai.cli_args import ServerConfig
from tests.helpers.checkpoints import tiny_model_dir
from tests.helpers.tokenizers import test_tokenizer
from tests.server.harness import ServerThread, make_engine
from tests.structured_output.test_server import SCHEMAS, TOOLS, TOOLS_TEMPLATE

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the weather?"}]


def _serve(tmp_path_factory, parser: str):
    path = tiny_model_dir(tmp_path_factory, "llama", f"tools-{parser}")
    engine = make_engine(path, max_model_len=512, structured_outputs_config={"disable_any_whitespace": True})
    config = ServerConfig(chat_template=TOOLS_TEMPLATE, enable_auto_tool_choice=True, tool_call_parser=parser,
                          reasoning_parser="qwen3" if parser == "hermes" else None)
    return ServerThread(engine, config)


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    with _serve(tmp_path_factory, "hermes") as server, OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    with _serve(tmp_path_factory, "mistral") as server, OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        yield c


def _both(client, **kw):
    """(whole, streamed) messages of the same request, as {reasoning, content, calls, finish}."""
    kw = {"model": None, "messages": MESSAGES, "temperature": 1.0, "seed": 11, "max_tokens": 200, **kw}
    choice = client.chat.completions.create(**kw).choices[0]
    message = choice.message
    whole = {
        "reasoning": getattr(message, "reasoning_content", None) or "",
        "content": message.content or "",
        "calls": [(t.function.name, t.function.arguments) for t in message.tool_calls or []],
        "finish": choice.finish_reason,
    }
    streamed = {"reasoning": "", "content": "", "calls": {}, "finish": None}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            streamed["reasoning"] += getattr(d, "reasoning_content", None) or ""
            streamed["content"] += d.content or ""
            for t in d.tool_calls or []:
                call = streamed["calls"].setdefault(t.index, {"id": None, "name": None, "arguments": ""})
                assert (t.id is None) == (call["id"] is not None), "an id comes once, first"
                call["id"] = call["id"] or t.id
                call["name"] = call["name"] or t.function.name
                call["arguments"] += t.function.arguments or ""
            if c.finish_reason is not None:
                assert streamed["finish"] is None
                streamed["finish"] = c.finish_reason
    assert list(streamed["calls"]) == list(range(len(streamed["calls"])))
    streamed["calls"] = [(c["name"], c["arguments"]) for c in streamed["calls"].values()]
    assert streamed == whole
    return whole


def _grammar(*parts: str) -> dict:
    return {"structured_outputs": {"grammar": "root ::= " + " ".join(json.dumps(p) for p in parts)}}


WEATHER = '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
ALARM = '{"name": "set_alarm", "arguments": {"hour": 7, "loud": true}}'
HERMES_OUTPUT = ("<think>hm</think>", "Sure.", f"<tool_call>{WEATHER}</tool_call>", f"<tool_call>{ALARM}</tool_call>", " Done.")


def test_hermes_reasoning_calls_and_the_text_around_them(hermes):
    message = _both(hermes, tools=TOOLS, extra_body=_grammar(*HERMES_OUTPUT))
    assert message == {
        "reasoning": "hm",
        "content": "Sure. Done.",  # " Done." after the calls was dropped
        "calls": [("get_weather", '{"city": "Oslo", "days": 2}'), ("set_alarm", '{"hour": 7, "loud": true}')],
        "finish": "tool_calls",
    }


def test_parallel_tool_calls_false_returns_one_call_under_auto(hermes):
    message = _both(hermes, tools=TOOLS, parallel_tool_calls=False, extra_body=_grammar(*HERMES_OUTPUT))
    assert message["calls"] == [("get_weather", '{"city": "Oslo", "days": 2}')] and message["finish"] == "tool_calls"


def test_a_call_cut_by_max_tokens_is_content_and_length(hermes):
    message = _both(hermes, tools=TOOLS, max_tokens=30, extra_body=_grammar(*HERMES_OUTPUT))
    assert message["finish"] == "length" and message["reasoning"] == "hm"
    assert message["content"].startswith("Sure.") and "<tool_call>" in message["content"]


@pytest.mark.parametrize("tool_choice, parallel, finish", [
    ("required", True, "tool_calls"),
    ("required", False, "tool_calls"),
    ({"type": "function", "function": {"name": "set_alarm"}}, True, "stop"),
])
def test_forced_calls_are_valid_and_stream_as_they_answer_whole(hermes, tool_choice, parallel, finish):
    for seed in (1, 2, 3):
        message = _both(hermes, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel, seed=seed)
        assert message["finish"] == finish and message["content"] == "" and message["calls"]
        assert parallel or len(message["calls"]) == 1
        for name, arguments in message["calls"]:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_mistral_parser_keeps_special_tokens_for_its_marker(mistral):
    """[TOOL_CALLS] is a special token of Mistral's tokenizers: skipped, as by default, the parser
    never saw it (vLLM keeps special tokens for this parser)."""
    special = test_tokenizer().convert_tokens_to_ids("<|im_start|>")
    kw = dict(max_tokens=2, extra_body={"allowed_token_ids": [special]})
    assert _both(mistral, tools=TOOLS, **kw)["content"] == "<|im_start|>" * 2
    assert _both(mistral, tools=TOOLS, tool_choice="none", **kw)["content"] == ""


@pytest.mark.parametrize("parts, content, calls, finish", [
    (("Plain answer.",), "Plain answer.", [], "stop"),
    (("Checking.", f"[TOOL_CALLS][{WEATHER}]"), "Checking.", [("get_weather", '{"city": "Oslo", "days": 2}')], "tool_calls"),
])
def test_mistral_end_of_sequence_token_is_no_part_of_the_message(mistral, parts, content, calls, finish):
    """With special tokens kept, the end-of-sequence token's text must not reach the content, nor
    break the call before it (the engine leaves a stop token's text out, as vLLM does)."""
    message = _both(mistral, tools=TOOLS, extra_body=_grammar(*parts))
    assert (message["content"], message["calls"], message["finish"]) == (content, calls, finish)


def test_a_constrained_reply_to_a_prompt_that_opens_think_is_content(hermes):
    """Qwen3 thinking models' and Qwen3.5's templates end the prompt with "<think>\n", so an
    unconstrained reply starts inside the thought (tests/server/test_tool_stream_splits.py). A
    grammar constrains the reply from its first token, so there the model never thinks: the JSON
    a client asked for with response_format is the content, not reasoning_content (it was, with
    content empty, before this was caught)."""
    opened = [*MESSAGES, {"role": "assistant", "content": "<think>\n"}]
    continued = {"add_generation_prompt": False, "continue_final_message": True}
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    message = _both(hermes, messages=opened, response_format=fmt, extra_body=continued)
    assert message["reasoning"] == "" and message["finish"] == "stop"
    jsonschema.validate(json.loads(message["content"]), schema)
    message = _both(hermes, messages=opened, extra_body={**continued, **_grammar("hm", "</think>", "Answer.")})
    assert (message["reasoning"], message["content"]) == ("", "hm</think>Answer.")


def test_mistral_tool_call_ids_are_nine_alphanumerics(mistral):
    """Mistral's chat templates raise on any other id when the call comes back in the next turn
    ("Tool call IDs should be alphanumeric strings with length 9!"); vLLM writes such ids."""
    kw = dict(model=None, messages=MESSAGES, tools=TOOLS, max_tokens=200, extra_body=_grammar(f"[TOOL_CALLS][{WEATHER}, {ALARM}]"))
    ids = [t.id for t in mistral.chat.completions.create(**kw).choices[0].message.tool_calls]
    ids += [t.id for chunk in mistral.chat.completions.create(stream=True, **kw) for c in chunk.choices
            for t in c.delta.tool_calls or [] if t.id]
    assert len(ids) == 4 and all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids)
