"""OpenAIServing: what every endpoint does before and around the engine.

Checks the model name, turns prompts and conversations into token ids, fits max_tokens into
the context, builds SamplingParams (errors named by field), and adds requests to the AsyncLLM
all or nothing. Prompts are tokenized here, not on the engine's thread: short ones on the event
loop, long ones (ENCODE_OFF_LOOP_CHARS) on a worker thread so that one huge prompt cannot stall
every other request; a text that cannot fit the context whatever its tokens is refused before
it is tokenized (at_least_tokens).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from folio.engine.async_llm import AsyncLLM, RequestStream
from folio.entrypoints.openai.errors import BadRequestError, from_engine_error, model_not_found
from folio.entrypoints.openai.protocol import ChatMessage, SamplingRequest
from folio.entrypoints.openai.request_logger import RequestLogger
from folio.entrypoints.openai.serving_models import OpenAIServingModels
from folio.lora.request import LoRARequest
from folio.sampling_params import BeamSearchParams, SamplingParams, SamplingParamsError
from folio.transformers_utils.chat_template import ChatTemplateError, check_template_kwargs, render_chat

# Texts at least this long are tokenized on a worker thread (fast tokenizers release the GIL;
# 2 MB of text takes ~1.5 s on a CPU core).
ENCODE_OFF_LOOP_CHARS = 100_000
# A text longer than max_model_len * the longest token's characters * this cannot fit whatever its
# tokens: refused untokenized (the slack covers normalizers that shorten text).
FIT_SLACK = 4
# The engine's names of fields that a request spells otherwise: a beam search's width is its `n`.
_REQUEST_FIELD = {"beam_width": "n"}


@dataclass(frozen=True)
class EnginePrompt:
    """A prompt ready for the engine: its token ids, and its text where there is one."""

    token_ids: list[int]
    text: str | None = None


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIServing:
    request_logger: RequestLogger | None = None  # set by the server with --enable-log-requests

    def __init__(
        self,
        engine: AsyncLLM,
        model_name: str,
        chat_template: str | None = None,
        models: OpenAIServingModels | None = None,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.models = models  # the served names, LoRA adapters included (None: the model only)
        self.chat_template = chat_template
        self.tokenizer = engine.tokenizer
        self._longest_token_chars: int | None = None  # at_least_tokens, read from the vocabulary once
        self.max_model_len = engine.model_config.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        self.default_params = engine.default_sampling_params()

    # ---- checks ---------------------------------------------------------------------------
    def check_model(self, model: str | None) -> LoRARequest | None:
        """None means the served model (vLLM's leniency); any other name must be served: the
        model (-> None) or a LoRA adapter (-> its LoRARequest); else a 404."""
        if self.models is not None:
            return self.models.resolve(model)
        if model is not None and model != self.model_name:
            raise model_not_found(model, self.model_name)
        return None

    def response_model(self, lora: LoRARequest | None) -> str:
        """The `model` a response names: the adapter's name for a LoRA request, as vLLM does."""
        return lora.lora_name if lora is not None else self.model_name

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < self.vocab_size):
            return  # two passes in C; the loop below only names the first bad id
        for token_id in token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise BadRequestError(
                    f"Token id {token_id} is outside the vocabulary [0, {self.vocab_size}).", param=param
                )

    def fit_max_tokens(
        self, num_prompt_tokens: int, requested: int | None, default: int | None,
        *, prompt_param: str, max_tokens_param: str = "max_tokens",
    ) -> int:
        """max_tokens for a prompt: the requested value if it fits the context, else a 400.

        With nothing requested: `default`, cut to the room left (None: all the room left).
        """
        noun = "messages" if prompt_param == "messages" else "prompt"
        if num_prompt_tokens == 0:
            raise BadRequestError(f"The {noun} is empty: at least one token is needed.", param=prompt_param)
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise BadRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens, and the "
                f"{noun} {'are' if noun == 'messages' else 'is'} {num_prompt_tokens} tokens long: no room is "
                "left for the completion.",
                param=prompt_param, code="context_length_exceeded",
            )
        if requested is None:
            return room if default is None else min(default, room)
        if requested > room:
            raise BadRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the "
                f"{noun}, {requested} for the completion). Reduce the length of the {noun} or "
                f"{max_tokens_param}.",
                param=max_tokens_param, code="context_length_exceeded",
            )
        return requested

    def truncate_prompt(self, prompt: EnginePrompt, request: SamplingRequest) -> EnginePrompt:
        """truncate_prompt_tokens: the prompt's last k tokens (-1: the context), before max_tokens
        is fitted to the room left. The text stays as given."""
        k = request.truncate_prompt_tokens
        if k is None:
            return prompt
        if k > self.max_model_len:
            raise BadRequestError(
                f"truncate_prompt_tokens={k} is more than the model's context ({self.max_model_len}).",
                param="truncate_prompt_tokens",
            )
        if k == 0:
            raise BadRequestError("truncate_prompt_tokens must be -1 or a positive integer, got 0.",
                                  param="truncate_prompt_tokens")
        keep = self.max_model_len if k == -1 else k
        return EnginePrompt(prompt.token_ids[-keep:], prompt.text)

    def check_stream_options(self, request: SamplingRequest) -> None:
        if request.stream_options is not None and not request.stream:
            raise BadRequestError("stream_options is only allowed when stream is true.", param="stream_options")

    def sampling_params(
        self, request: SamplingRequest, max_tokens: int, **kwargs: Any
    ) -> SamplingParams | BeamSearchParams:
        """The request's SamplingParams, or BeamSearchParams with use_beam_search (log-probs are
        not reported for beams: a 400 naming the field that asked for them)."""
        try:
            if request.use_beam_search:
                if kwargs.get("logprobs") is not None:
                    raise SamplingParamsError("logprobs", "logprobs cannot be used with use_beam_search.")
                if kwargs.get("prompt_logprobs") is not None:
                    raise SamplingParamsError("echo", "echo with logprobs cannot be used with use_beam_search.")
                return request.to_beam_search_params(max_tokens)
            return request.to_sampling_params(max_tokens, self.default_params, **kwargs)
        except SamplingParamsError as e:
            raise BadRequestError(str(e), param=e.param) from None

    # ---- prompts --------------------------------------------------------------------------
    def require_tokenizer(self, param: str, what: str) -> None:
        """A model served without a tokenizer takes token ids only, and returns no text."""
        if self.tokenizer is None:
            raise BadRequestError(f"This model has no tokenizer, so {what} cannot be served; "
                                  "send token ids, or restart the server with --tokenizer.", param=param)

    def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        self.require_tokenizer(param, "text prompts")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    async def encode_async(self, text: str, add_special_tokens: bool = True, param: str = "prompt",
                           truncating: bool = False) -> list[int]:
        """encode, with a long text first checked against the context (unless the request
        truncates it) and then tokenized off the event loop."""
        if len(text) < ENCODE_OFF_LOOP_CHARS:
            return self.encode(text, add_special_tokens, param)
        self.require_tokenizer(param, "text prompts")
        least = self.at_least_tokens(text)
        if not truncating and least > self.max_model_len:
            raise self.too_long_text(text, least, param, param if param in ("messages", "input") else "prompt")
        return await asyncio.to_thread(self.encode, text, add_special_tokens, param)

    def too_long_text(self, text: str, least: int, param: str, noun: str) -> BadRequestError:
        """The 400 for a text at least `least` tokens long (at_least_tokens) past the context."""
        return BadRequestError(f"This model's maximum context length is {self.max_model_len} tokens, and the "
                               f"{noun} ({len(text)} characters) is at least {least} tokens long.",
                               param=param, code="context_length_exceeded")

    def at_least_tokens(self, text: str) -> int:
        """A lower bound on the tokens of `text`: no token covers more characters than the
        longest vocabulary entry (with FIT_SLACK for normalizers). Whitespace is not counted:
        WordPiece and SentencePiece tokenizers may drop or merge it."""
        if self._longest_token_chars is None:
            vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
            self._longest_token_chars = max(map(len, vocab), default=0) or 10**9  # no vocabulary: no bound
        visible = len(text) - sum(map(text.count, " \t\n\r\x0b\x0c"))
        return visible // (self._longest_token_chars * FIT_SLACK)

    def decode(self, token_ids: list[int], param: str = "prompt") -> str:
        self.require_tokenizer(param, "text")
        return self.tokenizer.decode(token_ids)

    def render_chat(
        self,
        messages: list[ChatMessage],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template_kwargs: dict[str, Any] | None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        try:
            kwargs = check_template_kwargs(chat_template_kwargs)
        except ChatTemplateError as e:
            raise BadRequestError(str(e), param="chat_template_kwargs") from None
        try:
            return render_chat(
                self.chat_template,
                messages,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                tools=tools,
                bos_token=getattr(self.tokenizer, "bos_token", None),
                eos_token=getattr(self.tokenizer, "eos_token", None),
                **kwargs,
            )
        except ChatTemplateError as e:
            raise BadRequestError(str(e), param="messages") from None

    # ---- the engine -----------------------------------------------------------------------
    async def add_requests(
        self,
        request_id: str,
        prompts: list[EnginePrompt],
        params: list[SamplingParams],
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[RequestStream]:
        """Add one engine request per prompt (ids `{request_id}-{i}` when several): all or none.

        The request's sequences (prompts x n, n the beam width with beam search) are checked
        against the waiting queue at once, before anything is added (AsyncLLM.add_requests):
        more than it holds is a 400 (never queued), more than the room left a 503 (retry later).
        """
        requests = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            engine_prompt = {"prompt_token_ids": prompt.token_ids}
            if prompt.text is not None:
                engine_prompt["prompt"] = prompt.text
            if cache_salt is not None:
                engine_prompt["cache_salt"] = cache_salt
            if self.request_logger is not None:
                self.request_logger.log(engine_id, prompt.text, prompt.token_ids, p)
            requests.append((engine_id, engine_prompt, p))
        try:  # a cancel while waiting: the engine withdraws the requests itself
            if len(requests) == 1:  # the common case
                return [await self.engine.add_request(*requests[0], priority, lora_request)]
            return await self.engine.add_requests(requests, priority, lora_request)
        except Exception as e:
            error = from_engine_error(e)
            error.param = _REQUEST_FIELD.get(error.param, error.param)
            raise error from None
