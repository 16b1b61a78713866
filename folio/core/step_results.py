"""StepResults: the scheduler's update from a step's results: tokens appended, stop checks, drafts.

Mixed into Scheduler (core/scheduler.py): update_from_output answers schedule() once the runner
has sampled. It settles the placeholders and the drafts of each scheduled request, appends its
tokens up to the first that stops it (core/stop_conditions.py), finishes the requests that
stopped (through Scheduler._finish) and reports one EngineCoreOutput per request that changed.
"""

from __future__ import annotations

from folio.config.scheduler import SchedulerConfig
from folio.core.kv_cache_manager import KVCacheManager
from folio.core.outputs import EngineCoreOutput, ModelRunnerOutput
from folio.core.request import Request, RequestStatus
from folio.core.scheduler_output import SchedulerOutput
from folio.core.spec_decode_stats import SpecDecodeStats
from folio.core.speculation import settle_drafts
from folio.core.stop_conditions import check_stop
from folio.logger import init_logger

logger = init_logger(__name__)


class StepResults:
    """Scheduler's methods that apply a ModelRunnerOutput to the requests it answers."""

    # Scheduler's attributes these methods use (set in Scheduler.__init__).
    config: SchedulerConfig
    kv_cache_manager: KVCacheManager
    num_lookahead_tokens: int
    spec_stats: SpecDecodeStats

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply stop checks, free finished requests.

        One EngineCoreOutput per request that got tokens or prompt log-probs or finished.
        """
        scheduled = scheduler_output.scheduled
        if runner_output.req_ids != [s.request_id for s in scheduled]:
            raise ValueError("ModelRunnerOutput does not match the SchedulerOutput it answers.")
        self.kv_cache_manager.end_step()
        logprobs = runner_output.logprobs or [None] * len(scheduled)
        drafts = runner_output.spec_token_ids
        outputs = []
        for sched_index, (sched, token_ids, token_logprobs) in enumerate(
            zip(scheduled, runner_output.sampled_token_ids, logprobs)
        ):
            request = sched.request
            request.num_output_placeholders -= sched.samples
            if request.is_finished:  # aborted or stopped after schedule(): results are dropped
                continue
            if sched.spec_token_ids or (self.num_lookahead_tokens and not request.drafts_stopped):
                settle_drafts(self.kv_cache_manager, self.spec_stats, sched, len(token_ids))
            if drafts is not None:
                request.spec_token_ids = drafts[sched_index]
            if request.request_id in runner_output.drafts_stopped:
                # No lookahead from now on. A step planned ahead of this update reserved one
                # more; settle_drafts above has already released it (num_computed_tokens
                # counts that step's tokens, not the slots past them).
                request.drafts_stopped = True
            new_token_ids, status = self._append_tokens(request, token_ids)
            prompt_logprobs = runner_output.prompt_logprobs.get(request.request_id)
            if status is not None:
                self._finish(request, status)
            elif new_token_ids and request.pause_after_sample:
                request.paused = True  # until its beam search forks or finishes it
            if new_token_ids or prompt_logprobs is not None or status is not None:
                if token_logprobs is not None:
                    token_logprobs = token_logprobs[: len(new_token_ids)]
                outputs.append(
                    EngineCoreOutput(
                        request_id=request.request_id,
                        new_token_ids=new_token_ids,
                        new_logprobs=token_logprobs,
                        new_prompt_logprobs=prompt_logprobs,
                        finish_reason=request.status.finish_reason,
                        stop_reason=request.stop_reason,
                        num_cached_tokens=request.num_cached_tokens,
                    )
                )
        return outputs

    def _append_tokens(
        self, request: Request, token_ids: list[int]
    ) -> tuple[list[int], RequestStatus | None]:
        """Append tokens one by one; tokens after one that stops the request are dropped."""
        for i, token_id in enumerate(token_ids):
            if request.grammar is not None and not request.grammar.accept_token(token_id):
                # The mask allowed no token the grammar accepts (e.g. min_tokens banned the
                # only way to end): keep the output valid, end it before this token, and say so.
                logger.warning(
                    "Request %s: its structured output constraint allows no token that its other sampling "
                    "settings permit (min_tokens, ignore_eos, bad_words, allowed_token_ids or logit_bias); "
                    "the output ends here, before the constraint is complete.", request.request_id)
                return list(token_ids[:i]), RequestStatus.FINISHED_STOPPED
            request.append_output_token_ids([token_id])
            status = check_stop(request, self.config.max_model_len)
            if status is not None:
                return list(token_ids[: i + 1]), status
        return list(token_ids), None
