"""ChatOutputParser: an assistant's text as OpenAI's message parts — reasoning_content, content
and tool_calls — whole, or as the deltas of a stream.

Reasoning is split off first (a --reasoning-parser), then the rest goes to the request's
ToolPlan. Streaming re-parses the whole text at each step and sends what grew: the parsers
guarantee that reasoning, content and each call's arguments only grow by appending.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from folio.entrypoints.openai.protocol.tools import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from folio.entrypoints.openai.reasoning_parsers import ReasoningParser
from folio.entrypoints.openai.reasoning_parsers.think import START as THINK_START
from folio.entrypoints.openai.tool_choice import ToolPlan
from folio.entrypoints.openai.tool_parsers import ParsedCall


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass
class ParsedMessage:
    reasoning: str | None
    content: str
    calls: list[ParsedCall]
    make_id: Callable[[], str] = tool_call_id

    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(id=self.make_id(), function=FunctionCall(name=c.name, arguments=c.arguments)) for c in self.calls]


class ChatOutputParser:
    def __init__(self, plan: ToolPlan, reasoning: ReasoningParser | None, prompt: str = "",
                 constrained: bool = False, reasoning_first: bool = False) -> None:
        """constrained: a grammar holds from the output's first token; reasoning_first: the
        engine holds the grammar back until the model's </think> (structured_output/reasoning.py),
        so the output is reasoning, then the constrained reply."""
        self.plan = plan
        # A constrained output is the grammar's language: no <think> in it to split off.
        self.reasoning = reasoning if plan.schema is None or reasoning_first else None
        if constrained and self.reasoning is not None and self.reasoning.implicit_start:
            # nor is text before a </think> reasoning (deepseek_r1's implicit start): the grammar
            # holds from the first token, so the reply is reasoning only where it writes <think>
            self.reasoning = ReasoningParser()
        # A prompt that ends by opening <think> leaves the output inside it, unless a grammar
        # (response_format, structured_outputs) constrains the output from its first token: then
        # the model never thinks (folio applies grammars from the start; vLLM after </think>),
        # and what it writes is the answer the client asked for, not reasoning.
        # With reasoning_first the output is the thought until </think>, as the engine counts it.
        self.opened = reasoning_first or (not constrained and prompt.rstrip().endswith(THINK_START))

    @property
    def is_plain(self) -> bool:
        """Whether the text is the content, unchanged (no reasoning parser, no tools)."""
        return self.reasoning is None and self.plan.mode == "none"

    def parse(self, text: str, final: bool) -> ParsedMessage:
        reasoning, rest = (None, text) if self.reasoning is None else self.reasoning.split(text, final, self.opened)
        content, calls = self.plan.parse(rest, final)
        return ParsedMessage(reasoning, content, calls, self.call_id)

    def call_id(self) -> str:
        """A new tool call's id: in the --tool-call-parser's style under "auto" (Mistral's
        templates take 9 alphanumerics only, as vLLM's mistral parser writes them)."""
        parser = self.plan.parser if self.plan.mode == "auto" else None
        return parser.call_id() if parser is not None else tool_call_id()


@dataclass
class MessageDelta:
    reasoning: str | None
    content: str | None
    tool_calls: list[DeltaToolCall] | None

    @property
    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.tool_calls)


class MessageStreamer:
    """One choice's stream: feed the new text of each output, get what the message gained."""

    def __init__(self, parser: ChatOutputParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0
        self.call_ids: list[str] = []
        self.sent_arguments: list[int] = []

    @property
    def made_calls(self) -> bool:
        return bool(self.call_ids)

    def feed(self, new_text: str, final: bool) -> MessageDelta:
        self.text += new_text
        parsed = self.parser.parse(self.text, final)
        reasoning = (parsed.reasoning or "")[self.sent_reasoning :]
        content = parsed.content[self.sent_content :]
        self.sent_reasoning += len(reasoning)
        self.sent_content += len(content)
        deltas = [d for i, call in enumerate(parsed.calls) if (d := self._call_delta(i, call)) is not None]
        return MessageDelta(reasoning or None, content or None, deltas or None)

    def _call_delta(self, index: int, call: ParsedCall) -> DeltaToolCall | None:
        if index == len(self.call_ids):  # a new call: id, type and name first
            self.call_ids.append(self.parser.call_id())
            self.sent_arguments.append(len(call.arguments))
            function = DeltaFunctionCall(name=call.name, arguments=call.arguments)
            return DeltaToolCall(index=index, id=self.call_ids[index], type="function", function=function)
        grown = call.arguments[self.sent_arguments[index] :]
        if not grown:
            return None
        self.sent_arguments[index] += len(grown)
        return DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=grown))
