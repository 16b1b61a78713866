"""POST /v1/responses: OpenAI's Responses API for text, as vLLM serves it.

The input is rendered with the chat template (instructions first, as a system message) and
generated like a chat completion; the answer is one assistant message with one output_text part.
Streaming sends the Responses API's typed events, each `event: <type>` + `data: <json>` with a
sequence_number: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta (one per engine output),
response.output_text.done, response.content_part.done, response.output_item.done, and
response.completed, or response.incomplete when the answer was cut short: by max_output_tokens
(incomplete_details.reason "max_output_tokens") or by a shutdown past --shutdown-timeout, which
aborts the generation (finish_reason "abort": incomplete, with no incomplete_details, since
OpenAI's reasons name no such cause). A whole response takes the same status.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from folio.engine.async_llm import RequestStream
from folio.entrypoints.openai.errors import BadRequestError, from_engine_error, has_lone_surrogate
from folio.entrypoints.openai.protocol import ChatMessage, ErrorResponse
from folio.entrypoints.openai.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
)
from folio.entrypoints.openai.serving_engine import EnginePrompt, OpenAIServing
from folio.entrypoints.openai.streaming import EventStreamResponse, event_stream, final_outputs
from folio.outputs import RequestOutput
from folio.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError

router = APIRouter()

# The engine's finish reasons that leave a response "incomplete", each with its
# incomplete_details.reason (None: none of OpenAI's reasons says it).
INCOMPLETE_REASONS = {"length": "max_output_tokens", "abort": None}


class OpenAIServingResponses(OpenAIServing):
    async def create(self, request: ResponsesRequest) -> ResponsesResponse | EventStreamResponse:
        lora = self.check_model(request.model)
        if self.chat_template is None:
            raise BadRequestError("The model has no chat template; start the server with --chat-template.",
                                  param="input")
        text = self.render_chat(self._messages(request), add_generation_prompt=True,
                                continue_final_message=False, chat_template_kwargs=None)
        prompt = EnginePrompt(await self.encode_async(text, add_special_tokens=False, param="input"), text)
        max_tokens = self.fit_max_tokens(len(prompt.token_ids), request.max_output_tokens, None,
                                         prompt_param="input", max_tokens_param="max_output_tokens")
        params = self._params(request, max_tokens)
        response_id = f"resp_{uuid.uuid4().hex}"  # OpenAI's resp_ / msg_ ids, not random_id's dash
        streams = await self.add_requests(response_id, [prompt], [params], request.priority, None, lora)
        shell = self._shell(request, response_id)
        if request.stream:
            return await event_stream(self._events(shell, streams[0]), streams, [params])
        (output,) = await final_outputs(streams)
        return _finish(shell, output)

    def _messages(self, request: ResponsesRequest) -> list[ChatMessage]:
        messages = []
        if request.instructions:
            messages.append(ChatMessage(role="system", content=request.instructions))
        if isinstance(request.input, str):
            return [*messages, ChatMessage(role="user", content=request.input)]
        for i, item in enumerate(request.input):
            content = item.content
            if not isinstance(content, str):
                texts = []
                for part in content:
                    if part.type not in ("input_text", "output_text", "text") or part.text is None:
                        raise BadRequestError(f"Content parts of type {part.type!r} are not supported "
                                              "(text only).", param=f"input[{i}].content")
                    texts.append(part.text)
                content = "".join(texts)
            role = "system" if item.role == "developer" else item.role
            messages.append(ChatMessage(role=role, content=content))
        return messages

    def _params(self, request: ResponsesRequest, max_tokens: int) -> SamplingParams:
        def pick(name: str) -> Any:
            value = getattr(request, name)
            return getattr(self.default_params, name) if value is None else value

        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=pick("temperature"), top_p=pick("top_p"), top_k=pick("top_k"),
                min_p=pick("min_p"), repetition_penalty=pick("repetition_penalty"), seed=request.seed,
                output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
            )
        except SamplingParamsError as e:
            raise BadRequestError(str(e), param=e.param) from None

    def _shell(self, request: ResponsesRequest, response_id: str) -> ResponsesResponse:
        return ResponsesResponse(
            id=response_id, created_at=int(time.time()), status="in_progress", model=self.model_name, output=[],
            instructions=request.instructions, max_output_tokens=request.max_output_tokens,
            temperature=request.temperature, top_p=request.top_p, metadata=request.metadata, user=request.user,
        )

    async def _events(self, shell: ResponsesResponse, stream: RequestStream) -> AsyncIterator[str]:
        events = _EventWriter()
        message_id = "msg_" + shell.id.removeprefix("resp_")
        empty = OutputMessage(id=message_id, status="in_progress", content=[])
        yield events.write("response.created", response=shell.model_dump())
        yield events.write("response.in_progress", response=shell.model_dump())
        yield events.write("response.output_item.added", output_index=0, item=empty.model_dump())
        yield events.write("response.content_part.added", item_id=message_id, output_index=0, content_index=0,
                           part=OutputText(text="").model_dump())
        text, last, num_tokens = "", None, 0
        try:
            async for output in stream:
                last = output
                num_tokens += _num_output_tokens(output)  # DELTA outputs: the new tokens only
                delta = output.outputs[0].text if output.outputs else ""
                if delta:
                    text += delta
                    yield events.write("response.output_text.delta", item_id=message_id, output_index=0,
                                       content_index=0, delta=delta, logprobs=[])
        except Exception as e:  # the engine failed mid-stream: one error event ends it
            error = from_engine_error(e)
            yield events.write("error", code=error.code, message=error.message, param=error.param)
            return
        final = _finish(shell, last, text, num_tokens)
        item = final.output[0]
        yield events.write("response.output_text.done", item_id=message_id, output_index=0, content_index=0,
                           text=text, logprobs=[])
        yield events.write("response.content_part.done", item_id=message_id, output_index=0, content_index=0,
                           part=item.content[0].model_dump())
        yield events.write("response.output_item.done", output_index=0, item=item.model_dump())
        yield events.write(f"response.{final.status}", response=final.model_dump())


class _EventWriter:
    def __init__(self) -> None:
        self.sequence_number = 0

    def write(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        data = json.dumps(body, ensure_ascii=False)
        if has_lone_surrogate(data):  # UTF-8 cannot encode it (the stream would be cut): send it escaped
            data = json.dumps(body)
        return f"event: {kind}\ndata: {data}\n\n"


def _finish(shell: ResponsesResponse, output: RequestOutput | None, text: str | None = None,
            num_output: int | None = None) -> ResponsesResponse:
    """The completed (or incomplete) response for the request's last output (with streamed
    text and token count when it was streamed)."""
    completion = output.outputs[0] if output is not None and output.outputs else None
    if text is None:
        text = completion.text if completion is not None else ""
    finish_reason = completion.finish_reason if completion is not None else None
    status = "incomplete" if finish_reason in INCOMPLETE_REASONS else "completed"
    reason = INCOMPLETE_REASONS.get(finish_reason)
    message_id = "msg_" + shell.id.removeprefix("resp_")
    message = OutputMessage(id=message_id, status=status, content=[OutputText(text=text)])
    usage = None
    if output is not None:
        num_prompt = len(output.prompt_token_ids)
        num_output = _num_output_tokens(output) if num_output is None else num_output
        usage = ResponseUsage(input_tokens=num_prompt, input_tokens_details=InputTokensDetails(
            cached_tokens=output.num_cached_tokens or 0), output_tokens=num_output, total_tokens=num_prompt + num_output)
    return shell.model_copy(update=dict(
        status=status, output=[message], usage=usage,
        incomplete_details=IncompleteDetails(reason=reason) if reason is not None else None,
    ))


def _num_output_tokens(output: RequestOutput) -> int:
    return sum(len(c.token_ids) for c in output.outputs)


def _serving(request: Request) -> OpenAIServingResponses:
    from folio.entrypoints.openai.compat_routes import lazy_serving

    def make(state) -> OpenAIServingResponses:
        chat = state.chat
        serving = OpenAIServingResponses(chat.engine, chat.model_name, chat.chat_template, models=chat.models)
        serving.request_logger = chat.request_logger
        return serving

    return lazy_serving(request, "responses", make)


@router.post("/v1/responses", response_model=ResponsesResponse,
             responses={200: {"content": {"text/event-stream": {"schema": {  # each event: its type and JSON
                 "type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}},
                              "description": "A response object, or with stream=true typed server-sent events"},
                        **{status: {"model": ErrorResponse} for status in (400, 401, 404, 500, 503)}})
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    from folio.entrypoints.openai.disconnect import cancel_on_disconnect

    return await cancel_on_disconnect(request, _serving(request).create(body))
