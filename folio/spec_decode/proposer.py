"""Proposer: what a drafting method gets after each target step, and what it returns.

The runner calls `propose` once per step, after the target has sampled, with the step's batch
(the target's input tensors and its final hidden states, so a draft that mirrors the batch or a
head that reads the target's hidden states, EAGLE-style, finds what it needs) and, per request
that sampled, the tokens it emitted. It returns at most num_speculative_tokens drafts for each
of those requests; the scheduler caps them further (core/speculation.py). Drafts are point
masses (q = 1 on the drafted token), which rejection sampling turns into exact samples.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from folio.core.scheduler_output import ScheduledRequest
from folio.worker.step_inputs import StepInputBuilder, StepInputs


@dataclass
class ProposalBatch:
    scheduled: list[ScheduledRequest]  # the whole step, batch order
    inputs: StepInputs  # the target's flat batch of this step
    target_hidden: torch.Tensor  # [num_tokens (padded), hidden] the target's final hidden states
    # batch index -> tokens the request emitted this step (accepted drafts + its own token).
    emitted: dict[int, list[int]]

    def position_of_last(self, batch_index: int) -> int:
        """Position of the request's newest token: the first one no K/V exists for."""
        sched = self.scheduled[batch_index]
        return sched.end - len(sched.spec_token_ids) + len(self.emitted[batch_index]) - 1


class Proposer(ABC):
    def __init__(self, num_speculative_tokens: int) -> None:
        self.k = num_speculative_tokens

    @abstractmethod
    def propose(self, batch: ProposalBatch) -> dict[int, list[int]]:
        """Drafts per batch index of batch.emitted (requests that cannot speculate excluded)."""

    def observe(self, inputs: StepInputs) -> None:
        """The target's batch of this step, as soon as its forward is queued and before the
        step's tokens come to the host: a draft model queues its own pass over it here, so that
        pass runs on the GPU while the host verifies. Nothing by default."""

    def forget(self, request_ids) -> None:  # noqa: ANN001 (an iterable of request ids)
        """Requests that finished: drop whatever the proposer kept for them."""

    # ---- K/V of its own (draft models); none by default ------------------------------------
    @property
    def kv_bytes_per_block(self) -> int:
        return 0

    def initialize_kv_cache(self, num_blocks: int, num_cpu_blocks: int = 0) -> None:
        """Allocate the proposer's own paged K/V with the target's block count and size (and
        its swap pool with the target's number of CPU blocks)."""

    def move_blocks(self, scheduler_output) -> None:  # noqa: ANN001
        """Apply the step's block copies and swaps to the proposer's own K/V."""

    def capture_graphs(self, builder: StepInputBuilder, sizes: list[int]) -> None:
        """Capture CUDA graphs of the proposer's own forward passes, if it has any (on CUDA,
        once the K/V exists; the runner's step buffers and graph sizes)."""


def speculating(batch: ProposalBatch) -> list[int]:
    """Batch indices of the requests that sampled this step and may speculate."""
    return [i for i in batch.emitted if batch.scheduled[i].request.can_speculate]
