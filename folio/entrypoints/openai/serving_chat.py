"""POST /v1/chat/completions: a conversation in, assistant messages out (whole, or streamed).

Streaming follows OpenAI's chunks: each choice's first chunk carries the role (sent once its
first token exists), then content deltas, the last one with finish_reason; with
stream_options.include_usage one more chunk with no choices and the usage; then [DONE].
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator

from folio.engine.async_llm import AsyncLLM, RequestStream
from folio.entrypoints.openai.chat_message import ChatOutputParser, MessageStreamer
from folio.entrypoints.openai.errors import BadRequestError, from_engine_error, sse_error
from folio.entrypoints.openai.logprobs import chat_logprobs
from folio.entrypoints.openai.protocol import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    UsageInfo,
    make_usage,
)
from folio.entrypoints.openai.serving_engine import EnginePrompt, OpenAIServing, random_id
from folio.entrypoints.openai.serving_models import OpenAIServingModels
from folio.entrypoints.openai.reasoning_parsers import get_reasoning_parser
from folio.entrypoints.openai.tool_choice import ToolPlan, constrain_to_tools, plan_tools
from folio.entrypoints.openai.tool_parsers import get_tool_parser
from folio.entrypoints.openai.streaming import (
    DONE,
    ChunkFormat,
    EventStreamResponse,
    event_stream,
    final_outputs,
    sse,
)
from folio.outputs import CompletionOutput, RequestOutput
from folio.structured_output.reasoning import reasoning_end_token, reasoning_ended
from folio.sampling_params import SamplingParams


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self,
        engine: AsyncLLM,
        model_name: str,
        chat_template: str | None = None,
        models: OpenAIServingModels | None = None,
        *,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        super().__init__(engine, model_name, chat_template, models)
        # Parser names are checked when the server starts (cli_args.py): bad ones never get here.
        self.tool_parser = get_tool_parser(tool_parser) if tool_parser else None
        self.reasoning_parser = get_reasoning_parser(reasoning_parser) if reasoning_parser else None
        # the engine holds grammars back until </think> when the marker is one token (as here)
        self._reasoning = reasoning_end_token(reasoning_parser, self.tokenizer, warn=False) if reasoning_parser else None

    async def create(self, request: ChatCompletionRequest) -> ChatCompletionResponse | EventStreamResponse:
        lora = self.check_model(request.model)
        self.check_stream_options(request)
        plan = plan_tools(request.tools, request.tool_choice, self.tool_parser, request.parallel_tool_calls)
        text = self.render_chat(
            request.messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
            tools=[t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None,
        )
        token_ids = await self.encode_async(text, add_special_tokens=False, param="messages",
                                            truncating=request.truncate_prompt_tokens is not None)
        prompt = EnginePrompt(token_ids, text)
        prompt = self.truncate_prompt(prompt, request)
        params = constrain_to_tools(self._params(request, prompt), plan)
        keeps_special_tokens = plan.parser is not None and plan.parser.keeps_special_tokens
        if keeps_special_tokens and isinstance(params, SamplingParams):
            params.skip_special_tokens = False  # the parser's markers are special tokens (vLLM's adjust_request)
        elif keeps_special_tokens:
            params = dataclasses.replace(params, skip_special_tokens=False)
        request_id = random_id("chatcmpl")
        streams = await self.add_requests(request_id, [prompt], [params], request.priority, request.cache_salt, lora)
        call = _Call(request, request_id, int(time.time()), self.response_model(lora))
        constrained = getattr(params, "structured_outputs", None) is not None
        first = constrained and self._reasoning is not None and not reasoning_ended(prompt.token_ids, *self._reasoning)
        call.parser = ChatOutputParser(plan, self.reasoning_parser, text, constrained and not first, first)
        if request.stream:
            return await event_stream(self._events(call, streams[0]), streams, [params])
        (output,) = await final_outputs(streams)
        return self._response(call, output)

    def _params(self, request: ChatCompletionRequest, prompt: EnginePrompt) -> SamplingParams:
        if request.max_completion_tokens is not None:
            requested, param = request.max_completion_tokens, "max_completion_tokens"
        else:
            requested, param = request.max_tokens, "max_tokens"
        max_tokens = self.fit_max_tokens(
            len(prompt.token_ids), requested, None, prompt_param="messages", max_tokens_param=param
        )
        if request.top_logprobs is not None and not request.logprobs:
            raise BadRequestError("top_logprobs needs logprobs set to true.", param="top_logprobs")
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        try:
            return self.sampling_params(request, max_tokens, logprobs=logprobs)
        except BadRequestError as e:
            if e.param == "max_tokens":
                e.param = param
            elif e.param == "logprobs":
                e.param = "top_logprobs"
            raise

    # ---- a whole response -----------------------------------------------------------------
    def _response(self, call: _Call, output: RequestOutput) -> ChatCompletionResponse:
        choices = []
        for c in output.outputs:
            message, made_calls = _message(call.parser, c.text)
            choices.append(ChatChoice(
                index=c.index,
                message=message,
                logprobs=self._logprobs(call, c),
                finish_reason=_finish_reason(c.finish_reason, made_calls, call.parser.plan.mode == "named"),
                stop_reason=c.stop_reason,
            ))
        return ChatCompletionResponse(
            id=call.request_id, created=call.created, model=call.model, choices=choices, usage=_usage(output)
        )

    def _logprobs(self, call: _Call, c: CompletionOutput) -> ChatChoiceLogprobs | None:
        if not call.request.logprobs:
            return None
        content = chat_logprobs(self.tokenizer, c.token_ids, c.logprobs or [], call.request.top_logprobs or 0)
        return ChatChoiceLogprobs(content=content)

    # ---- a stream of events ---------------------------------------------------------------
    async def _events(self, call: _Call, stream: RequestStream) -> AsyncIterator[str]:
        role_sent: set[int] = set()
        streamers: dict[int, MessageStreamer] = {}
        completion_tokens = 0
        last: RequestOutput | None = None
        try:
            async for output in stream:
                last = output
                for c in output.outputs:
                    completion_tokens += len(c.token_ids)
                    if c.index not in role_sent:
                        role_sent.add(c.index)
                        yield self._event(call, ChatStreamChoice(
                            index=c.index, delta=DeltaMessage(role="assistant", content="")))
                    if call.parser.is_plain:
                        choice = self._delta_choice(call, c)
                    else:
                        streamer = streamers.setdefault(c.index, MessageStreamer(call.parser))
                        choice = self._parsed_delta_choice(call, c, streamer)
                    if choice is not None:
                        yield self._event(call, choice)
            if call.request.include_usage_in_stream and last is not None:
                usage = _usage(last, completion_tokens)
                yield sse(ChatCompletionStreamResponse(
                    id=call.request_id, created=call.created, model=call.model, choices=[], usage=usage))
        except Exception as e:  # after the 200 went out, errors travel as an event
            yield sse_error(from_engine_error(e))
        yield DONE

    def _event(self, call: _Call, choice: ChatStreamChoice) -> str:
        return call.chunks.event(choice)

    def _delta_choice(self, call: _Call, c: CompletionOutput) -> ChatStreamChoice | None:
        logprobs = self._logprobs(call, c)
        # A new token is an event even when its text is held back (a possible stop string) or
        # there is none (a model served without a tokenizer): clients time tokens by events.
        if not c.token_ids and not c.text and c.finish_reason is None and not (logprobs and logprobs.content):
            return None
        return ChatStreamChoice(
            index=c.index,
            delta=DeltaMessage(content=c.text) if c.text or c.token_ids else DeltaMessage(),
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )


    def _parsed_delta_choice(self, call: _Call, c: CompletionOutput, streamer: MessageStreamer) -> ChatStreamChoice | None:
        """A delta of reasoning, content and tool calls (a reasoning parser or tools in use)."""
        final = c.finish_reason is not None
        delta = streamer.feed(c.text, final)
        logprobs = self._logprobs(call, c)
        if delta.empty and not c.token_ids and not final and not (logprobs and logprobs.content):
            return None
        return ChatStreamChoice(
            index=c.index,
            delta=DeltaMessage(content=delta.content, reasoning_content=delta.reasoning, tool_calls=delta.tool_calls),
            logprobs=logprobs,
            finish_reason=_finish_reason(c.finish_reason, streamer.made_calls, call.parser.plan.mode == "named"),
            stop_reason=c.stop_reason,
        )


def _message(parser: ChatOutputParser, text: str) -> tuple[ChatResponseMessage, bool]:
    """The assistant message for a finished text, and whether it holds tool calls."""
    if parser.is_plain:
        return ChatResponseMessage(content=text), False
    parsed = parser.parse(text, final=True)
    calls = parsed.tool_calls()
    content = parsed.content or (None if calls else "")
    return ChatResponseMessage(content=content, tool_calls=calls, reasoning_content=parsed.reasoning), bool(calls)


def _finish_reason(reason: str | None, made_calls: bool, named: bool) -> str | None:
    """A reply that ended normally with tool calls finishes with "tool_calls", as in OpenAI;
    a call forced by a named tool_choice finishes with "stop", as OpenAI (and vLLM) answer it."""
    return "tool_calls" if reason == "stop" and made_calls and not named else reason


class _Call:
    def __init__(self, request: ChatCompletionRequest, request_id: str, created: int, model: str) -> None:
        self.request = request
        self.request_id = request_id
        self.created = created
        self.model = model
        self.parser = ChatOutputParser(ToolPlan("none"), None)
        self.chunks = ChunkFormat(request_id, "chat.completion.chunk", created, model, request.include_usage_in_stream)


def _usage(output: RequestOutput, completion_tokens: int | None = None) -> UsageInfo:
    if completion_tokens is None:
        completion_tokens = sum(len(c.token_ids) for c in output.outputs)
    return make_usage(len(output.prompt_token_ids), completion_tokens, output.num_cached_tokens)
