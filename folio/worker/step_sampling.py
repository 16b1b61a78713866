"""The sampling half of a model runner's step: logits, sampling, draft verification, prompt log-probs.

StepSampling is mixed into ModelRunner (worker/model_runner.py): launch_forward queues a step's
forward pass and returns a StagedStep; launch_sampling, here, runs the LM head on the rows that
need it, samples (or verifies drafts and drafts the next ones), scores prompt log-probs and
queues the copies of the results to the host. Under tensor parallelism each LM-head call is a
gather the followers join, so the calls are counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from folio.core.scheduler_output import ScheduledRequest
from folio.logger import init_logger
from folio.sample.metadata import SamplingMetadata, SamplingRow
from folio.sample.sampler import Sampler, gather_logprobs, make_request_generator
from folio.sample.transfer import to_device
from folio.worker import step_broadcast
from folio.worker.pending_output import PendingOutput
from folio.worker.sampled_ids import DeviceSampledIds
from folio.worker.staged_step import StagedStep
from folio.worker.step_inputs import PromptLogprobsPlan, StepInputs

if TYPE_CHECKING:
    from folio.models.base import CausalLM
    from folio.spec_decode.speculator import Speculator

logger = init_logger(__name__)


class StepSampling:
    """ModelRunner's methods from a staged forward pass to a sealed PendingOutput."""

    # ModelRunner's attributes these methods use (set in ModelRunner.__init__).
    device: torch.device
    model: CausalLM
    vocab_size: int
    sampler: Sampler
    speculator: Speculator | None
    generators: dict[str, torch.Generator]
    prompt_logprobs_done: dict[str, int]
    last_sampled: DeviceSampledIds
    leads_followers: bool

    @torch.inference_mode()
    def launch_sampling(self, staged: StagedStep) -> PendingOutput:
        """The second half of launch: logits, sampling (or verifying drafts), drafting the next
        tokens, prompt log-probs, copies to the host."""
        inputs, hidden, pending = staged.inputs, staged.hidden, staged.pending
        if inputs is None or hidden is None:
            return pending
        scheduled = staged.scheduled
        self._gathers_made = 0
        emitted: dict[int, list[int]] = {}
        try:
            sampled = None
            if inputs.sampling_batch_indices:
                sampled = self._sample(hidden, inputs, scheduled, pending)
            else:
                self.last_sampled.record(None, [], [])
            if self.speculator is not None:  # refused with tp > 1: no gathers of its own
                emitted = self._verify(hidden, inputs, scheduled, sampled, pending)
            for plan in inputs.prompt_logprobs_plans:
                self._score_prompt(hidden, plan, scheduled[plan.batch_index], pending)
        except BaseException:  # Ctrl-C in a logits processor too
            self._join_remaining_gathers(hidden, inputs)
            raise
        pending.seal(self.device)
        if self.speculator is not None:
            # After the seal: result() does not wait for the draft model's steps, so the engine
            # updates requests and schedules the next step while the GPU drafts.
            pending.spec_token_ids = self.speculator.propose(scheduled, inputs, hidden, emitted)
            pending.speculative = bool(inputs.verify_batch_indices) or any(map(len, pending.spec_token_ids))
            pending.drafts_stopped = self.speculator.take_newly_stale()
        return pending

    def _compute_logits(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """The LM head on some rows of the hidden states: under tensor parallelism one gather
        the followers join (counted, so a failed step can still make the ones they wait for)."""
        self._gathers_made += 1
        return self.model.compute_logits(hidden, widen)  # [rows, vocab]

    def _join_remaining_gathers(self, hidden: torch.Tensor, inputs: StepInputs) -> None:
        """After an error in sampling (a user's logits processor raised, say): make the LM-head
        gathers the step's plan promised and rank 0 skipped, or the followers would wait in one
        while rank 0's next step began (a hang, or collectives paired wrongly)."""
        if not self.leads_followers:
            return
        try:
            for rows in step_broadcast.logit_sets(inputs, self.device)[self._gathers_made :]:
                self.model.compute_logits(hidden[rows])  # [rows, vocab], dropped
        except Exception:  # a dead peer: the step's own error (and the worker watcher) say why
            logger.exception("Could not join the followers' LM-head gathers after a failed step.")

    def _sample(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        inputs: StepInputs,
        scheduled: list[ScheduledRequest],
        pending: PendingOutput,
    ) -> torch.Tensor:
        """Sample the step's ordinary rows; returns the sampled ids [rows] on the device."""
        # In the model dtype: the sampler widens what it edits (a float32 copy of every step's
        # logits was 60 us of a 7 ms W1 step on the 0.6B, session 21).
        if inputs.logits_indices is None:  # every token samples (decode): no gather
            logits = self._compute_logits(hidden[: inputs.num_tokens], widen=False)  # [num_tokens, vocab]
        else:
            logits = self._compute_logits(hidden[inputs.logits_indices], widen=False)  # [num_sampling, vocab]
        indices = inputs.sampling_batch_indices
        rows = [self._sampling_row(scheduled[i]) for i in indices]
        metadata = SamplingMetadata.build(rows, self.vocab_size, self.device)
        result = self.sampler(logits, metadata)
        pending.add_sampled(result.sampled_token_ids, indices)  # the step's one copy to the host
        self.last_sampled.record(result.sampled_token_ids, scheduled, indices)
        if result.logprobs is None:
            return result.sampled_token_ids
        wanted = [
            (row, batch_index, num)
            for row, (batch_index, sampling_row) in enumerate(zip(indices, rows))
            if (num := sampling_row.params.logprobs) is not None
        ]
        pending.add_logprobs(result.logprob_token_ids, result.logprobs, result.sampled_ranks, wanted)
        return result.sampled_token_ids

    def _verify(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        inputs: StepInputs,
        scheduled: list[ScheduledRequest],
        sampled: torch.Tensor | None,  # [sampling rows] from _sample
        pending: PendingOutput,
    ) -> dict[int, list[int]]:
        """Verify the drafts of requests that carried some; returns what each request that
        sampled emitted (batch index -> tokens), for the proposer. A step that drafts or
        verifies is synchronous (engine/llm_engine.py): its tokens come to the host here; one
        that does neither (a paused speculator) reads nothing and may run ahead."""
        assert self.speculator is not None
        if not self.speculator.observed:  # launch_forward observes; propose() relies on it
            self.speculator.observe(scheduled, inputs)
        emitted: dict[int, list[int]] = {}
        if sampled is not None and self.speculator.step_drafts:  # else no host read: no wait
            emitted = {b: [t] for b, t in zip(inputs.sampling_batch_indices, sampled.tolist())}
        if inputs.verify_batch_indices:
            rows = to_device(inputs.verify_rows, torch.int64, self.device)
            logits = self.model.compute_logits(hidden[rows])  # [verify rows, vocab]
            verifying = [scheduled[i] for i in inputs.verify_batch_indices]
            verified = self.speculator.verify(logits, verifying, self._generator_for)
            for b, token_ids, logprobs in zip(inputs.verify_batch_indices, verified.token_ids, verified.logprobs):
                pending.add_verified(b, token_ids, logprobs)
                emitted[b] = token_ids
        return emitted

    def _score_prompt(
        self,
        hidden: torch.Tensor,
        plan: PromptLogprobsPlan,
        sched: ScheduledRequest,
        pending: PendingOutput,
    ) -> None:
        rows = to_device(plan.token_rows, torch.int64, self.device)
        logits = self._compute_logits(hidden[rows])  # [n, vocab]
        targets = to_device(plan.target_ids, torch.int64, self.device)
        num = sched.request.sampling_params.prompt_logprobs or 0
        ids, values, ranks = gather_logprobs(logits, targets, num)
        pending.add_prompt_logprobs(sched.request_id, plan.start, ids, values, ranks)
        self.prompt_logprobs_done[sched.request_id] = plan.start + len(plan.target_ids)

    def _generator_for(self, sched: ScheduledRequest) -> torch.Generator | None:
        """The request's own generator (made on first use) when it is seeded and samples."""
        request = sched.request
        params = request.sampling_params
        if params.seed is None or params.sampling_type_greedy:
            return None
        generator = self.generators.get(request.request_id)
        if generator is None:
            generator = make_request_generator(params.seed, self.device)
            self.generators[request.request_id] = generator
        return generator

    def _sampling_row(self, sched: ScheduledRequest) -> SamplingRow:
        request = sched.request
        params = request.sampling_params
        generator = self._generator_for(sched)
        num_outputs = sched.end - request.num_prompt_tokens  # before this one, placeholders included
        return SamplingRow(
            params, request.prompt_token_ids, request.output_token_ids, generator, num_outputs, request.grammar
        )
