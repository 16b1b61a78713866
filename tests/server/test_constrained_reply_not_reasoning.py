"""A constrained chat reply (response_format, structured_outputs) is content for every reasoning
parser. f7757b4 made it so for a prompt that opens <think> (qwen3), but deepseek_r1's parser reads
text before any </think> as reasoning even without an opening tag (implicit_start), so with
--reasoning-parser deepseek_r1 a response_format JSON reply was all reasoning_content and content
was empty. folio applies the grammar from the first token: the reply is the answer."""

from __future__ import annotations

import pytest

from folio.entrypoints.openai.chat_message import ChatOutputParser
from folio.entrypoints.openai.reasoning_parsers import get_reasoning_parser
from folio.entrypoints.openai.tool_choice import ToolPlan

REPLY = '{"answer": 42}'


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("prompt", ["<|User|>hi<|Assistant|><think>\n", "user: hi\nassistant:"])
def test_a_constrained_reply_is_content(name, prompt):
    parser = ChatOutputParser(ToolPlan("none"), get_reasoning_parser(name), prompt, constrained=True)
    for final in (False, True):
        message = parser.parse(REPLY, final)
        assert (message.reasoning, message.content) == (None, REPLY)


def test_an_unconstrained_deepseek_reply_still_splits():
    parser = ChatOutputParser(ToolPlan("none"), get_reasoning_parser("deepseek_r1"), "<think>\n")
    message = parser.parse("let me see</think>\n" + REPLY, True)
    assert (message.reasoning, message.content) == ("let me see", REPLY)


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_a_grammar_that_writes_think_is_still_split(name):
    parser = ChatOutputParser(ToolPlan("none"), get_reasoning_parser(name), "hi", constrained=True)
    message = parser.parse("<think>hm</think>" + REPLY, True)
    assert (message.reasoning, message.content) == ("hm", REPLY)
