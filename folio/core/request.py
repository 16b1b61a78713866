"""Request: one sequence being generated, as the scheduler and KV cache manager see it.

A request carries its prompt and output token ids and `num_computed_tokens`, the number of its
tokens whose K/V are in the cache. Every kind of step (prefill chunk, decode, resume after
preemption, prefix-cache hit) is just "compute the next few of `all_token_ids`".

Requests that share blocks by fork form a family (`family_id`): the n samples of one user
request (each child waits for `parent`, the first sample, to compute the prompt, then shares its
blocks), or the beams of one beam search (`pause_after_sample`: after each token the request
stops being scheduled until the beam search forks or ends it).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from folio.lora.request import LoRARequest
from folio.sampling_params import SamplingParams

if TYPE_CHECKING:
    from folio.structured_output.backend import GrammarState


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # waiting again, after its blocks were taken
    # Everything from here on is finished.
    FINISHED_STOPPED = 3  # EOS, a stop token or a stop string
    FINISHED_LENGTH_CAPPED = 4  # max_tokens or max_model_len
    FINISHED_ABORTED = 5  # the client went away or the caller aborted

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # lower runs first under the "priority" policy
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # Tokens found in the prefix cache when the request was first scheduled.
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    # Output tokens sampled by steps already scheduled whose ids are not back on the host yet
    # (async scheduling: at most one step is in flight). Counted from schedule() to
    # update_from_output(), so the scheduler can plan the next step around them.
    num_output_placeholders: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    # prompt + output, kept as one list so the runner reads it without concatenating.
    all_token_ids: list[int] = field(default_factory=list)
    # Mixed into the first block's hash: requests with different salts never share K/V.
    cache_salt: str | None = None
    # The adapter the request runs with (None: the base model); also part of the cache key.
    lora_request: LoRARequest | None = None
    # Hashes of the leading full blocks of all_token_ids, filled lazily (core/block_hash.py).
    block_hashes: list[bytes] = field(default_factory=list, repr=False)
    # Fork family: n > 1 samples of one request, or the beams of one search.
    family_id: str | None = None
    # n > 1: the sample that computes the prompt; this one shares its blocks instead.
    parent: Request | None = field(default=None, repr=False)
    # Beam search: stop scheduling after each sampled token until forked or finished.
    pause_after_sample: bool = False
    paused: bool = False
    # Structured outputs: this sample's grammar state, in step with output_token_ids (the
    # scheduler advances it with each appended token; preemption keeps the outputs, so it
    # keeps the state too). Set before the request reaches the scheduler.
    grammar: GrammarState | None = field(default=None, repr=False)
    # Speculative decoding: tokens a proposer drafted to follow all_token_ids, verified by the
    # request's next step (1 + len of them scheduled); never part of all_token_ids. A draft
    # model's are PendingDrafts (core/pending_drafts.py) until something reads their ids.
    spec_token_ids: Sequence[int] = field(default_factory=list)
    # Its draft model's K/V missed a step (the speculator was paused): no more drafts for it,
    # so no more lookahead slots (core/speculation.py).
    drafts_stopped: bool = False

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("A request needs at least one prompt token.")
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        """Known tokens plus those being sampled: what the next step continues from."""
        return len(self.all_token_ids) + self.num_output_placeholders

    @property
    def needs_sync_steps(self) -> bool:
        """Whether each of its steps must wait for the previous one's sampled ids on the host.

        Penalties count the output's token ids on the host, and a beam stops after each token
        until its beam search forks it: neither can be planned around a placeholder. Everything
        else a step needs (input ids, min_tokens counts, seeds) is known or on the device; a
        grammar's mask is filled after the previous step's update (engine/llm_engine.py).
        """
        p = self.sampling_params
        return (
            self.pause_after_sample
            or p.repetition_penalty != 1.0
            or p.frequency_penalty != 0.0
            or p.presence_penalty != 0.0
            or bool(p.bad_words_token_ids)  # bans follow the output's last tokens
            or bool(p.logits_processors)  # user code reads the output's token ids
        )

    @property
    def lora_int_id(self) -> int:
        """The adapter's id, 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def can_speculate(self) -> bool:
        """Whether drafts may be proposed for it. Not for beams (one token, then a fork),
        structured outputs (the grammar's mask must see each token before the next) nor vLLM's
        per-request logits processors: user code that tracks the output (a hand-made constraint)
        would be handed drafts it never allowed, and could fail or ban every token on them."""
        return self.no_speculation_reason is None

    @property
    def no_speculation_reason(self) -> str | None:
        """Why drafts are never proposed for it (can_speculate), None if they may be."""
        p = self.sampling_params
        if self.pause_after_sample:
            return "beam search"
        if getattr(p, "structured_outputs", None) or getattr(p, "guided_decoding", None):
            return "structured output"
        if getattr(p, "logits_processors", None):
            return "logits processors"
        return None

    @property
    def max_tokens(self) -> int | None:
        return self.sampling_params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
