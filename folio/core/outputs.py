"""Typed results that cross the core/ boundary: from the model runner, and to the engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probs at one position: the chosen token first, then the top-k (k may be 0)."""

    token_ids: list[int]  # [chosen] + top_k ids, best first
    logprobs: list[float]  # same length as token_ids
    rank: int  # rank of the chosen token in the vocabulary (1 = most likely)


@dataclass(frozen=True)
class PromptLogprobsChunk:
    """Prompt log-probs computed in one step: entries for prompt tokens start, start+1, ..."""

    start: int  # index (>= 1) of the first prompt token these entries score
    entries: list[TokenLogprobs]


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]  # same order as SchedulerOutput.scheduled
    # Per request, the tokens sampled this step: [] while a prompt is still being prefilled.
    sampled_token_ids: list[list[int]]
    # Per request: one TokenLogprobs per sampled token, or None when logprobs were not asked.
    logprobs: list[list[TokenLogprobs] | None] | None = None
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
    # Speculative decoding: per request, the drafts proposed for its next step ([] for none);
    # None when no proposer runs.
    spec_token_ids: list[Sequence[int]] | None = None  # per request; PendingDrafts from a draft model
    # Requests that will get no more drafts (a draft model skipped them while paused): the
    # scheduler stops reserving lookahead slots for them.
    drafts_stopped: frozenset[str] = frozenset()


@dataclass
class EngineCoreOutput:
    """What one step produced for one request, after the scheduler's stop checks."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    new_prompt_logprobs: PromptLogprobsChunk | None = None
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
