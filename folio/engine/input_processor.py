"""InputProcessor: checks a prompt and its SamplingParams and turns them into core Requests.

Everything a request could be rejected for is checked here, before anything is queued, so a
bad input raises ValueError and leaves the engine untouched.
"""

from __future__ import annotations

import dataclasses

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from folio.config import ModelConfig
from folio.core.request import Request
from folio.logger import init_logger
from folio.lora.request import LoRARequest
from folio.param_checks import check_int
from folio.sampling_params import BeamSearchParams, SamplingParams, SamplingParamsError

logger = init_logger(__name__)

PromptType = str | Mapping[str, Any]


@dataclass(frozen=True)
class ProcessedPrompt:
    text: str | None  # None for token prompts
    token_ids: list[int]
    # vLLM's `cache_salt` prompt key: mixed into the first block's hash, so requests with
    # different salts never share cached K/V (tenants that must not see each other's prompts).
    cache_salt: str | None = None
    # The adapter every request made from this prompt runs with (None: the base model).
    lora_request: LoRARequest | None = None


# The keys a dict prompt may carry (vLLM's TextPrompt / TokensPrompt, text only).
_PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "cache_salt"})
# torch.Generator.manual_seed takes seeds below 2**64 (negative ones it reads modulo 2**64).
_SEED_MODULUS = 2**64


def check_priority(priority: object, policy: str) -> None:
    """An int; other than 0 only under the priority policy (vLLM's rule: never ignored)."""
    check_int("priority", priority, minimum=-(2**63))
    if priority != 0 and policy != "priority":
        raise SamplingParamsError("priority", f"Got priority {priority}, but priority scheduling is not enabled; "
                                  "start the engine with scheduling_policy='priority'.")


class InputProcessor:
    def __init__(
        self,
        model_config: ModelConfig,
        tokenizer: Any,
        eos_token_ids: set[int],
        max_logprobs: int,
    ) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_logprobs = max_logprobs
        self.vocab_size = model_config.vocab_size
        _warn_if_tokenizer_is_larger(tokenizer, self.vocab_size)

    def process_request(self, prompt: PromptType, params: Any) -> ProcessedPrompt:
        """The prompt, checked and truncated, and its params checked: everything a request can be
        refused for before an adapter is loaded (which may push another out of the CPU cache)."""
        if isinstance(params, BeamSearchParams):
            processed = self.process_prompt(prompt)
            self.check_beam_search(params, len(processed.token_ids))
            return processed
        self.check_params(params)
        processed = self.truncate_prompt(self.process_prompt(prompt), params)
        self.check_length(len(processed.token_ids))
        return processed

    def process_prompt(self, prompt: PromptType) -> ProcessedPrompt:
        if isinstance(prompt, str):
            return ProcessedPrompt(prompt, self._encode(prompt))
        if isinstance(prompt, Mapping):
            unknown = sorted(str(k) for k, v in prompt.items() if k not in _PROMPT_KEYS and v is not None)
            if unknown:  # an image or an option that would be dropped unread
                why = "folio serves text-only models" if "multi_modal_data" in unknown else "folio does not read them"
                raise ValueError(f"Prompt keys {', '.join(unknown)} are not supported ({why}); a prompt takes "
                                 f"{', '.join(sorted(_PROMPT_KEYS))}.")
            salt = prompt.get("cache_salt")
            if salt is not None and (not isinstance(salt, str) or not salt):
                raise SamplingParamsError("cache_salt", f"cache_salt must be a non-empty string, got {salt!r}.")
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                self._check_token_ids(ids)
                return ProcessedPrompt(prompt.get("prompt"), list(ids), salt)
            if isinstance(prompt.get("prompt"), str):
                return ProcessedPrompt(prompt["prompt"], self._encode(prompt["prompt"]), salt)
        raise ValueError(
            "A prompt must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
            f"got {type(prompt).__name__}."
        )

    def check_params(self, params: Any, num_prompt_tokens: int | None = None) -> SamplingParams:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {type(params).__name__}.")
        params.verify()  # fields may have been set since construction (sp.n = 3, sp.temperature = nan)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise SamplingParamsError(
                    name, f"{name}={value} is more than max_logprobs={self.max_logprobs}."
                )
        for name in ("stop_token_ids", "allowed_token_ids"):
            for tok in getattr(params, name) or []:
                self._check_token_id(tok, name)
        for tok in (params.logit_bias or {}):
            self._check_token_id(tok, "logit_bias")
        ending = self._check_min_tokens(params)
        if params.stop and self.tokenizer is None:  # no text is made: the strings would never match
            raise SamplingParamsError("stop", "stop strings need a tokenizer; this engine has none "
                                              "(use stop_token_ids).")
        if params.bad_words:
            if self.tokenizer is None:
                raise SamplingParamsError("bad_words", "bad_words needs a tokenizer; this engine has none.")
            params.update_from_tokenizer(self.tokenizer)
            self._check_bad_words(params, ending)
        return params

    def _check_min_tokens(self, params: SamplingParams) -> set[int]:
        """The tokens min_tokens bans (EOS, stop_token_ids; none without min_tokens); a 400 if they
        are every token the output may start with."""
        allowed = params.allowed_token_ids
        ending: set[int] = set()
        if params.min_tokens:
            ending = set(params.stop_token_ids or ()) | (set() if params.ignore_eos else self.eos_token_ids)
            if (set(allowed) <= ending if allowed else  # min_tokens bans every token it may take
                    len(ending) >= self.vocab_size and ending.issuperset(range(self.vocab_size))):
                field = "allowed_token_ids" if allowed else "stop_token_ids"
                raise SamplingParamsError(field, f"Every token {'in allowed_token_ids ' if allowed else ''}"
                                          "ends the output (EOS or stop_token_ids), which min_tokens forbids: "
                                          "nothing can be generated.")
        return ending

    def _check_bad_words(self, params: SamplingParams, ending: set[int]) -> None:
        """A 400 if bad_words' one-token words (and min_tokens' bans, `ending`) cover
        allowed_token_ids (the engine answered 200 with a token outside them: session 27's review)."""
        allowed = params.allowed_token_ids
        if allowed:
            always = {ids[0] for ids in params.bad_words_token_ids if len(ids) == 1}  # banned at every step
            if set(allowed) <= always | ending:
                raise SamplingParamsError("bad_words", "bad_words bans every token in allowed_token_ids"
                                          f"{' that min_tokens leaves' if params.min_tokens else ''}: nothing "
                                          "can be generated.")

    def truncate_prompt(self, prompt: ProcessedPrompt, params: Any) -> ProcessedPrompt:
        """truncate_prompt_tokens: keep the prompt's last k token ids (text kept as given)."""
        if not isinstance(params, SamplingParams) or params.truncate_prompt_tokens is None:
            return prompt
        ids = params.truncated_prompt(prompt.token_ids, self.model_config.max_model_len)
        return dataclasses.replace(prompt, token_ids=ids)

    def make_requests(
        self,
        request_id: str,
        prompt: ProcessedPrompt,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> list[Request]:
        """One Request per sample: best_of (>= n) > 1 fans out into children `{i}_{request_id}`.

        The children form a fork family: child 0 computes the prompt, the others wait for it
        and share its blocks (core/admission.py), computing only the last prompt token each.
        With a seed, child i samples with seed + i, so samples differ but repeat across runs;
        seed + i wraps modulo 2**64 (torch's seed range), so any valid seed takes any n.
        Only child 0 scores the prompt (prompt_logprobs). With best_of > n every child tracks
        its cumulative log-prob (logprobs=0 at least), by which the n best are returned.
        """
        arrival = time.monotonic() if arrival_time is None else arrival_time
        num_samples = params.best_of or params.n
        if num_samples == 1:
            return [self._request(request_id, prompt, params, arrival, priority)]
        children: list[Request] = []
        for index in range(num_samples):
            child = params.clone()
            child.n = child.best_of = 1
            if params.seed is not None:
                child.seed = (params.seed + index) % _SEED_MODULUS
            if index > 0:
                child.prompt_logprobs = None
            if num_samples > params.n and child.logprobs is None:
                child.logprobs = 0
            request = self._request(child_request_id(index, request_id), prompt, child, arrival, priority)
            request.family_id = request_id
            request.parent = children[0] if children else None
            children.append(request)
        return children

    def check_beam_search(self, params: Any, num_prompt_tokens: int) -> None:
        """Beams ask for max(2, 1 + #eos) * beam_width log-probs per token: within max_logprobs;
        and a search makes at least one token, so the prompt must leave room for it."""
        self.check_length(num_prompt_tokens)
        max_len = self.model_config.max_model_len
        if num_prompt_tokens >= max_len:
            raise SamplingParamsError("prompt", f"The prompt is {num_prompt_tokens} tokens long: no room to "
                                                f"generate within max_model_len={max_len}.")
        num_eos = 0 if params.ignore_eos else len(self.eos_token_ids)
        wanted = max(2, 1 + num_eos) * params.beam_width
        if wanted > self.max_logprobs:
            raise SamplingParamsError(
                "beam_width",
                f"beam_width={params.beam_width} needs {wanted} log-probs per token, more than "
                f"max_logprobs={self.max_logprobs}; raise max_logprobs or lower beam_width."
            )

    def _request(self, request_id, prompt, params, arrival, priority) -> Request:
        params.update_from_model(self.eos_token_ids)
        self.check_length(len(prompt.token_ids))
        request = Request(request_id, list(prompt.token_ids), params, arrival_time=arrival, priority=priority)
        request.cache_salt = prompt.cache_salt
        request.lora_request = prompt.lora_request
        return request

    def check_length(self, num_prompt_tokens: int) -> None:
        if num_prompt_tokens == 0:
            raise SamplingParamsError("prompt", "The prompt is empty: at least one token is needed.")
        max_len = self.model_config.max_model_len
        if num_prompt_tokens > max_len:
            raise SamplingParamsError(
                "prompt",
                f"The prompt is {num_prompt_tokens} tokens long, more than the maximum model "
                f"length of {max_len}."
            )

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("This engine has no tokenizer: pass {'prompt_token_ids': [...]}.")
        ids = list(self.tokenizer.encode(text))
        # A tokenizer larger than the model's embedding gives ids the model has no row for.
        top = max(ids, default=-1)
        if top >= self.vocab_size:
            raise SamplingParamsError(
                "prompt", f"The prompt encodes to token id {top}, outside the model's vocabulary "
                f"[0, {self.vocab_size}): the tokenizer does not match the model."
            )
        return ids

    def _check_token_ids(self, ids: Any) -> None:
        if not isinstance(ids, (list, tuple)):
            raise ValueError("prompt_token_ids must be a list of integers.")
        # One pass in C over the whole prompt (a 30k-token prompt's per-token Python checks cost
        # ~4 ms of its time to first token); the per-token check runs only to name a bad id.
        if ids and (set(map(type, ids)) - {int} or min(ids) < 0 or max(ids) >= self.vocab_size):
            for tok in ids:
                self._check_token_id(tok, "prompt_token_ids")

    def _check_token_id(self, tok: Any, field: str) -> None:
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise SamplingParamsError(field, f"{field} must hold integers, got {tok!r}.")
        if not 0 <= tok < self.vocab_size:
            raise SamplingParamsError(
                field, f"{field}: token id {tok} is outside the vocabulary [0, {self.vocab_size})."
            )


def _warn_if_tokenizer_is_larger(tokenizer: Any, vocab_size: int) -> None:
    """Say at start-up when the tokenizer has ids the model cannot embed (a model padded beyond
    its tokenizer, the usual case, is fine): text prompts holding them are refused."""
    try:
        size = len(tokenizer) if tokenizer is not None else 0
    except TypeError:  # a tokenizer without len(): nothing to compare
        return
    if size > vocab_size:
        logger.warning("The tokenizer has %d tokens but the model's vocab_size is %d: prompts with "
                       "token ids >= %d will be refused. Is it the model's tokenizer?", size, vocab_size, vocab_size)


def child_request_id(index: int, parent_id: str) -> str:
    return f"{index}_{parent_id}"
