"""The objects `LLM.generate` returns, with vLLM's names and fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Logprob:
    """The log-probability of one token, its rank in the vocabulary and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per generated token: token id -> Logprob (the top-k plus the sampled token).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token; the first is None (nothing precedes it).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    kv_transfer_params: dict | None = field(default=None, repr=False)


@dataclass
class EmbeddingOutput:
    """One prompt's embedding (vLLM's name); `hidden_size` numbers."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """What `LLM.embed` returns per prompt, as vLLM's: `output.outputs.embedding`."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    prompt: str | None = None


@dataclass
class PoolingOutput:
    """One prompt's pooled hidden states (vLLM's name): `data` is a float32 tensor [hidden]."""

    data: torch.Tensor


@dataclass
class PoolingRequestOutput:
    """What `LLM.encode` returns per prompt, as vLLM's: `output.outputs.data`."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    prompt: str | None = None


@dataclass
class ScoringOutput:
    """One pair's score (vLLM's name)."""

    score: float


@dataclass
class ScoringRequestOutput:
    """What `LLM.score` returns per pair, as vLLM's: `output.outputs.score`. prompt_token_ids
    are the first prompt's, the tokenizer's pad token (if it has one), then the second's, as vLLM
    joins them for an embedding score."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True
