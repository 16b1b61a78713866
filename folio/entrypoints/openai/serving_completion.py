"""POST /v1/completions: prompts in, text completions out (whole, or streamed as events).

Choices are numbered prompt by prompt: prompt i's sample j is choice i * n + j.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from folio.entrypoints.openai.errors import BadRequestError, from_engine_error, sse_error
from folio.entrypoints.openai.logprobs import completion_logprobs
from folio.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    make_usage,
)
from folio.entrypoints.openai.serving_engine import EnginePrompt, OpenAIServing, random_id
from folio.entrypoints.openai.streaming import (
    DONE,
    ChunkFormat,
    EventStreamResponse,
    event_stream,
    final_outputs,
    iterate_streams,
    sse,
)
from folio.engine.async_llm import RequestStream
from folio.outputs import CompletionOutput, RequestOutput
from folio.sampling_params import SamplingParamsError

# OpenAI's default for /v1/completions.
DEFAULT_MAX_TOKENS = 16


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, request: CompletionRequest) -> CompletionResponse | EventStreamResponse:
        lora = self.check_model(request.model)
        self._check_supported(request)
        self._check_fits_queue(request)
        prompts = [self.truncate_prompt(p, request) for p in await self._prompts(request)]
        params = [self._params(request, p) for p in prompts]
        request_id = random_id("cmpl")
        streams = await self.add_requests(request_id, prompts, params, request.priority, request.cache_salt, lora)
        call = _Call(request, request_id, int(time.time()), self.response_model(lora), prompts)
        if request.stream:
            return await event_stream(self._events(call, streams), streams, params)
        outputs = await final_outputs(streams)
        return self._response(call, outputs)

    # ---- before the engine ----------------------------------------------------------------
    def _check_supported(self, request: CompletionRequest) -> None:
        self.check_stream_options(request)
        if request.suffix:
            raise BadRequestError("suffix is not supported.", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise BadRequestError("best_of other than n is not supported.", param="best_of")

    def _check_fits_queue(self, request: CompletionRequest) -> None:
        """The engine's 400 for a request whose sequences (prompts x n) outnumber the waiting queue
        itself, given before its prompts are tokenized: 20,000 short prompts took ~1.1 s of the
        event loop to tokenize, only to be refused (with use_beam_search, n is the beam width)."""
        try:
            self.engine.check_fits_queue([request.n] * _num_prompts(request.prompt))
        except SamplingParamsError as e:
            raise BadRequestError(str(e), param=e.param) from None

    async def _prompts(self, request: CompletionRequest) -> list[EnginePrompt]:
        prompt = request.prompt
        truncating = request.truncate_prompt_tokens is not None
        if isinstance(prompt, str):
            return [EnginePrompt(await self.encode_async(prompt, truncating=truncating), prompt)]
        if not prompt:
            raise BadRequestError("prompt must not be empty.", param="prompt")
        # A validated list holds one kind (protocol/completion.py's Prompt): its first item tells which.
        if isinstance(prompt[0], int):
            return [self._token_prompt(prompt, request.echo)]
        if isinstance(prompt[0], str):
            return [EnginePrompt(await self.encode_async(p, truncating=truncating), p) for p in prompt]
        return [self._token_prompt(p, request.echo) for p in prompt]

    def _token_prompt(self, token_ids: list[int], echo: bool) -> EnginePrompt:
        self.check_token_ids(token_ids, "prompt")
        return EnginePrompt(list(token_ids), self.decode(token_ids, "echo") if echo and token_ids else None)

    def _params(self, request: CompletionRequest, prompt: EnginePrompt):
        max_tokens = self.fit_max_tokens(
            len(prompt.token_ids), request.max_tokens, DEFAULT_MAX_TOKENS, prompt_param="prompt"
        )
        if request.logprobs is not None:
            self.require_tokenizer("logprobs", "log-probs (token texts)")
        echo_logprobs = request.logprobs if request.echo else None
        return self.sampling_params(request, max_tokens, logprobs=request.logprobs, prompt_logprobs=echo_logprobs)

    # ---- a whole response -----------------------------------------------------------------
    def _response(self, call: _Call, outputs: list[RequestOutput]) -> CompletionResponse:
        choices = []
        for i, output in enumerate(outputs):
            for c in output.outputs:
                choices.append(self._final_choice(call, i, output, c))
        return CompletionResponse(
            id=call.request_id, created=call.created, model=call.model,
            choices=choices, usage=_usage(outputs),
        )

    def _final_choice(self, call: _Call, i: int, output: RequestOutput, c: CompletionOutput) -> CompletionChoice:
        request = call.request
        echo = request.echo
        text = (call.prompt_text(i) + c.text) if echo else c.text
        logprobs = None
        if request.logprobs is not None:
            echoed, offset = self._echoed_logprobs(call, i, output) if echo else (None, 0)
            logprobs, _ = completion_logprobs(self.tokenizer, list(c.token_ids), list(c.logprobs or []), offset)
            if echoed is not None:
                logprobs = _joined(echoed, logprobs)
        return CompletionChoice(
            index=i * request.n + c.index, text=text, logprobs=logprobs,
            finish_reason=c.finish_reason, stop_reason=c.stop_reason,
        )

    def _echoed_logprobs(self, call: _Call, i: int, output: RequestOutput) -> tuple[CompletionLogprobs, int]:
        """Prompt i's log-probs (echo) and the text offset after them, built once per prompt:
        its n choices all begin with them, and a long prompt's top-k entries cost far more to
        convert than a few generated tokens (2,000 tokens x 20 alternatives x n=128 held the
        event loop ~2 s when built per choice)."""
        cached = call.echoed.get(i)
        if cached is not None:
            return cached
        ids = list(output.prompt_token_ids)
        entries = output.prompt_logprobs
        built = completion_logprobs(self.tokenizer, ids, list(entries or [None] * len(ids)), 0)
        if entries is not None:  # a delta without them (an engine process sends them once) is not kept
            call.echoed[i] = built
        return built

    # ---- a stream of events ---------------------------------------------------------------
    async def _events(self, call: _Call, streams: list[RequestStream]) -> AsyncIterator[str]:
        finished: list[RequestOutput] = []
        completion_tokens = 0
        try:
            async for i, output in iterate_streams(streams):
                for c in output.outputs:
                    completion_tokens += len(c.token_ids)
                    choice = self._delta_choice(call, i, output, c)
                    if choice is not None:
                        yield call.chunks.event(choice)
                if output.finished:
                    finished.append(output)
            if call.request.include_usage_in_stream:
                usage = _usage(finished, completion_tokens)
                yield sse(self._chunk(call, [], usage))
        except Exception as e:  # after the 200 went out, errors travel as an event
            yield sse_error(from_engine_error(e))
        yield DONE

    def _chunk(self, call: _Call, choices: list[CompletionChoice], usage=None) -> CompletionStreamResponse:
        return CompletionStreamResponse(
            id=call.request_id, created=call.created, model=call.model, choices=choices, usage=usage
        )

    def _delta_choice(self, call: _Call, i: int, output: RequestOutput, c: CompletionOutput) -> CompletionChoice | None:
        """The event for one delta, or None when it has nothing new (a prefill chunk's step).

        A new token is an event even when its text is held back (a possible stop string) or
        there is none (a model served without a tokenizer): clients time tokens by events."""
        request = call.request
        index = i * request.n + c.index
        first = index not in call.offsets
        offset = call.offsets.setdefault(index, 0)
        text = call.prompt_text(i) + c.text if first and request.echo else c.text
        logprobs: CompletionLogprobs | None = None
        if request.logprobs is not None:
            echoed = None
            if first and request.echo:
                echoed, offset = self._echoed_logprobs(call, i, output)
            logprobs, call.offsets[index] = completion_logprobs(
                self.tokenizer, list(c.token_ids), list(c.logprobs or []), offset)
            if echoed is not None:
                logprobs = _joined(echoed, logprobs)
        if not c.token_ids and not text and c.finish_reason is None and not (logprobs and logprobs.tokens):
            return None
        return CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=c.finish_reason, stop_reason=c.stop_reason
        )


class _Call:
    """One /v1/completions call: what its events and choices need to know."""

    def __init__(self, request: CompletionRequest, request_id: str, created: int, model: str,
                 prompts: list[EnginePrompt]) -> None:
        self.request = request
        self.request_id = request_id
        self.created = created
        self.model = model
        self.prompts = prompts
        self.offsets: dict[int, int] = {}  # choice index -> legacy text_offset reached
        self.echoed: dict[int, tuple[CompletionLogprobs, int]] = {}  # prompt index -> _echoed_logprobs
        self.chunks = ChunkFormat(request_id, "text_completion", created, model, request.include_usage_in_stream)

    def prompt_text(self, i: int) -> str:
        return self.prompts[i].text or ""


def _num_prompts(prompt: str | list) -> int:
    """The engine requests a validated prompt makes: one text, one list of token ids, or one per
    item of a batch (protocol/completion.py's Prompt; a list holds one kind)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return 1
    return len(prompt)


def _usage(outputs: list[RequestOutput], completion_tokens: int | None = None):
    if completion_tokens is None:
        completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return make_usage(
        prompt_tokens=sum(len(o.prompt_token_ids) for o in outputs),
        completion_tokens=completion_tokens,
        cached_tokens=sum(o.num_cached_tokens for o in outputs),
    )


def _joined(head: CompletionLogprobs, rest: CompletionLogprobs) -> CompletionLogprobs:
    """head's entries then rest's, unvalidated: both were built by completion_logprobs, and
    validating a prompt's entries again for each choice would cost what sharing them saves.
    The lists are new; the entries (top_logprobs dicts) are shared, and never changed."""
    return CompletionLogprobs.model_construct(
        _fields_set=set(),  # as completion_logprobs builds it: CompletionLogprobs(), then appends
        tokens=head.tokens + rest.tokens,
        token_logprobs=head.token_logprobs + rest.token_logprobs,
        top_logprobs=head.top_logprobs + rest.top_logprobs,
        text_offset=head.text_offset + rest.text_offset,
    )
