"""StagedStep: a step between its two launches, its forward pass queued and its sampling not.

ModelRunner.launch_forward returns one and ModelRunner.launch_sampling finishes it; in between
the engine may bring grammar states (and the requests a proposer drafts from) up to date with
the previous step's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.core.scheduler_output import ScheduledRequest
from folio.worker.pending_output import PendingOutput
from folio.worker.step_inputs import StepInputs


@dataclass
class StagedStep:
    """A step whose forward pass is queued and whose sampling is not (ModelRunner.launch_forward)."""

    scheduled: list[ScheduledRequest]
    inputs: StepInputs | None  # None: nothing was scheduled
    hidden: torch.Tensor | None  # [num_tokens, hidden]
    pending: PendingOutput
    drafts: bool = False  # its sampling proposes drafts (Speculator.observe): that reads the
    # requests' tokens on the host, so it must wait for the previous step's update

    @property
    def waits_for_previous(self) -> bool:
        """Whether its sampling must wait until the previous step's tokens are on the requests:
        a grammar's mask, or drafts proposed from the request's history."""
        return self.drafts or self.samples_with_grammar

    @property
    def samples_with_grammar(self) -> bool:
        """Whether a row it samples has a grammar: its mask must wait for the previous step."""
        if self.inputs is None:
            return False
        return any(self.scheduled[i].request.grammar is not None for i in self.inputs.sampling_batch_indices)
