"""LLMEngine: add_request / step / abort over the scheduler, the model runner and the output side.

One step = schedule -> forward + sample -> stop checks -> text and RequestOutputs. The engine is
single-threaded; AsyncLLM drives it from the server's event loop.

Async scheduling (SchedulerConfig.async_scheduling, on by default): step() launches the next
step before it waits for the current one, so the device runs step N+1 while the host turns step
N's tokens into outputs and plans step N+2. The scheduler plans around each running request's
token still in flight (a placeholder, core/scheduler.py); the runner gathers its id on the
device. What that costs and why it is safe:
- a request that a stop token or stop string ends at step N had a slot in step N+1: that
  result is dropped; requests ending by length are not scheduled past their end;
- K/V: every step's work is queued on one CUDA stream, in launch order. Blocks freed after
  step N (finished, aborted, preempted requests) are handed out again only by a later
  schedule(), whose step is queued after N and N+1, so a new owner never has its blocks written
  by an old owner's wasted step, and CPU swap blocks follow the same order. A wasted step writes
  only its request's own placeholder slot, in a block the prefix cache does not hold (blocks are
  registered only once every token in them is known);
- requests that need each token on the host before the next step (penalties, beam search:
  Request.needs_sync_steps) make steps synchronous while any is unfinished;
- when step() returns with nothing left to run, nothing is in flight.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from folio.config import EngineConfig
from folio.core.request import RequestStatus
from folio.core.outputs import ModelRunnerOutput
from folio.core.scheduler import Scheduler
from folio.core.scheduler_output import SchedulerOutput
from folio.engine.arg_utils import EngineArgs
from folio.engine.beam_search import BeamSearchManager, BeamSearchParams
from folio.engine.input_processor import InputProcessor, PromptType
from folio.engine.output_processor import OutputProcessor
from folio.logger import init_logger
from folio.outputs import RequestOutput
from folio.sampling_params import SamplingParams
from folio.transformers_utils.tokenizer import eos_token_ids, get_tokenizer, has_tokenizer_files
from folio.worker.model_runner import ModelRunner
from folio.worker.pending_output import PendingOutput

logger = init_logger(__name__)

# generation_config.json keys that become SamplingParams defaults, as in vLLM.
_GENERATION_DEFAULTS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    kv_cache_usage: float
    num_preemptions: int
    # Prefix caching, counted in tokens since start (a lookup per admission, resumes included).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_rate: float = 0.0  # hits / queries
    num_cached_blocks: int = 0  # blocks holding a cached full block's K/V now (used or free)
    num_evicted_blocks: int = 0  # cached blocks reallocated, since start
    # Work done: tokens put through the model since start, and of them prompt tokens.
    num_computed_tokens: int = 0
    num_computed_prompt_tokens: int = 0
    # Sharing and swapping since start.
    num_copied_blocks: int = 0  # copy-on-write copies
    num_swap_preemptions: int = 0  # of num_preemptions, those that swapped instead of recomputing
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0
    num_cpu_blocks: int = 0
    num_free_cpu_blocks: int = 0
    # KV waste, over all steps so far (core/kv_waste.py): the fraction of allocated paged KV
    # slots holding no token, and what contiguous per-request preallocation would have wasted
    # on the same running requests, reserving max_model_len or prompt + max_tokens each.
    kv_waste_fraction: float = 0.0
    kv_waste_fraction_prealloc_max_model_len: float = 0.0
    kv_waste_fraction_prealloc_max_tokens: float = 0.0
    # Speculative decoding since start (core/spec_decode_stats.py): request-steps that verified
    # drafts, their draft tokens, the accepted ones, and accepted drafts at each position.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()


class LLMEngine:
    def __init__(self, config: EngineConfig, max_logprobs: int = 20) -> None:
        start = time.perf_counter()
        self.config = config
        self.tokenizer = _load_tokenizer(config)
        self.runner = ModelRunner(config)
        self.num_blocks = self.runner.determine_num_blocks()
        self.runner.initialize_kv_cache(self.num_blocks)
        self.scheduler = Scheduler(
            config.scheduler,
            self.num_blocks,
            config.cache.block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            num_cpu_blocks=self.runner.swap_pool.num_blocks,
            num_lookahead_tokens=self.runner.speculator.num_lookahead_tokens if self.runner.speculator else 0,
        )
        eos = eos_token_ids(self.tokenizer, config.model.generation_config)
        self.input_processor = InputProcessor(config.model, self.tokenizer, eos, max_logprobs)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.beam_search = BeamSearchManager(self.scheduler, self.tokenizer, eos, config.model.max_model_len)
        self._request_errors: dict[str, Exception] = {}
        self.async_scheduling = config.scheduler.async_scheduling
        if self.async_scheduling and config.speculative is not None:
            # A verify step's accepted count decides where the next step starts: it cannot be
            # planned before the previous step's tokens are on the host.
            logger.info("Speculative decoding runs synchronous steps: async scheduling is off.")
            self.async_scheduling = False
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None  # launched, not updated
        self._spec_drafts_logged = 0
        logger.info(
            "Engine ready in %.1f s: %s on %s, dtype %s, max_model_len %d, max_num_seqs %d, "
            "max_num_batched_tokens %d",
            time.perf_counter() - start,
            config.model.architecture,
            config.device.device,
            config.model.dtype,
            config.model.max_model_len,
            config.scheduler.max_num_seqs,
            config.scheduler.max_num_batched_tokens,
        )

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_engine_config(), max_logprobs=args.max_logprobs)

    # ---- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | BeamSearchParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Queue a request; raises ValueError (nothing queued) if anything about it is invalid.

        With BeamSearchParams the request is a beam search: one RequestOutput when it is done,
        its beam_width best sequences as completions, best first (engine/beam_search.py)."""
        if request_id in self.output_processor.requests or request_id in self.beam_search.searches:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        params = params if params is not None else self.default_sampling_params()
        processed = self.input_processor.process_prompt(prompt)
        if isinstance(params, BeamSearchParams):
            self.input_processor.check_beam_search(params, len(processed.token_ids))
            self._log_no_speculation(request_id, "beam search")
            self.beam_search.add(request_id, processed, params, arrival_time, priority)
            return
        self.input_processor.check_params(params, len(processed.token_ids))
        requests = self.input_processor.make_requests(
            request_id, processed, params, arrival_time, priority
        )
        clash = [r.request_id for r in requests if r.request_id in self.output_processor.samples]
        if clash:
            raise ValueError(f"Request id {clash[0]!r} is already in use.")
        self.output_processor.add_request(
            request_id,
            processed.text,
            processed.token_ids,
            params,
            [r.request_id for r in requests],
            [r.sampling_params for r in requests],
            requests[0].arrival_time,
        )
        if not requests[0].can_speculate:
            self._log_no_speculation(request_id, "structured output")
        for request in requests:
            self.scheduler.add_request(request)

    def _log_no_speculation(self, request_id: str, reason: str) -> None:
        if self.config.speculative is not None:
            logger.info("Request %s: no speculative decoding with %s.", request_id, reason)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        core_ids = self.output_processor.abort_requests(ids)
        self.scheduler.finish_requests(core_ids, RequestStatus.FINISHED_ABORTED)
        self.beam_search.abort(ids)
        self._settle_if_idle()  # rather than at the next request's first step

    def step(self) -> list[RequestOutput]:
        """The outputs of one step. With async scheduling the next step is running on the
        device when this returns, unless nothing is left to run or a request needs
        synchronous steps."""
        if not self.async_scheduling:
            scheduler_output = self.scheduler.schedule()
            outputs = self._finish_step(scheduler_output, self.runner.execute_model(scheduler_output))
            self._log_spec_stats_if_idle()
            return outputs
        current = self._in_flight or self._launch()
        self._in_flight = None if self.scheduler.requires_sync_steps else self._launch()
        outputs = self._finish_step(current[0], current[1].result())
        self._settle_if_idle()
        return outputs

    def _log_spec_stats_if_idle(self) -> None:
        """Speculative decoding's counters, once each time the engine runs out of work."""
        stats = self.scheduler.spec_stats
        if stats.num_drafts != self._spec_drafts_logged and not self.scheduler.has_unfinished_requests():
            self._spec_drafts_logged = stats.num_drafts
            logger.info("Speculative decoding so far: %s", stats.summary())

    def _settle_if_idle(self) -> None:
        """With nothing left to run, wait for the step in flight and drop its results (every
        request in it has finished or was aborted), so an idle engine holds no launched step."""
        if self._in_flight is not None and not self.scheduler.has_unfinished_requests():
            scheduler_output, pending = self._in_flight
            self._in_flight = None
            self._finish_step(scheduler_output, pending.result())

    def _launch(self) -> tuple[SchedulerOutput, PendingOutput]:
        scheduler_output = self.scheduler.schedule()
        return scheduler_output, self.runner.launch(scheduler_output)

    def _finish_step(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        """Stop checks, beam search, text and RequestOutputs for one step's sampled tokens."""
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        beam_outputs, core_outputs = self.beam_search.process(core_outputs)
        outputs, stopped = self.output_processor.process_outputs(core_outputs)
        outputs += beam_outputs
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        for request_id, (error, core_ids) in self.output_processor.take_errors().items():
            self.scheduler.finish_requests(core_ids, RequestStatus.FINISHED_ABORTED)
            self._request_errors[request_id] = error
        return outputs

    def isolate_request_errors(self) -> None:
        """From now on an exception while processing one request's output fails that request
        only: step() drops it and take_request_errors() reports it (AsyncLLM relies on this)."""
        self.output_processor.isolate_errors = True

    def take_request_errors(self) -> dict[str, Exception]:
        """Requests that failed in step() since the last call, by request id, with the cause."""
        errors, self._request_errors = self._request_errors, {}
        return errors

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests() or self.beam_search.has_unfinished()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.requests) + len(self.beam_search.searches)

    # ---- information ------------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the checkpoint's generation_config.json defaults applied."""
        gen = self.config.model.generation_config
        kwargs = {ours: gen[theirs] for theirs, ours in _GENERATION_DEFAULTS.items() if gen.get(theirs) is not None}
        if isinstance(gen.get("max_new_tokens"), int):
            kwargs["max_tokens"] = gen["max_new_tokens"]
        try:
            return SamplingParams(**kwargs)
        except ValueError:
            logger.warning("Ignoring invalid sampling defaults in generation_config.json: %s", kwargs)
            return SamplingParams()

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            num_blocks=self.num_blocks,
            num_free_blocks=s.kv_cache_manager.num_free_blocks,
            kv_cache_usage=s.kv_usage,
            num_preemptions=s.num_preemptions,
            spec_decode_num_drafts=s.spec_stats.num_drafts,
            spec_decode_num_draft_tokens=s.spec_stats.num_draft_tokens,
            spec_decode_num_accepted_tokens=s.spec_stats.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=tuple(s.spec_stats.accepted_per_position),
            **_memory_stats(s),
        )


def _memory_stats(s: Scheduler) -> dict[str, Any]:
    """Prefix cache, sharing, swap and KV waste counters for EngineStats."""
    kv, waste = s.kv_cache_manager, s.waste
    cache, swap = kv.prefix_cache, kv.swap_space
    return dict(
        prefix_cache_queries=kv.prefix_cache_queries,
        prefix_cache_hits=kv.prefix_cache_hits,
        prefix_cache_hit_rate=kv.prefix_cache_hits / kv.prefix_cache_queries if kv.prefix_cache_queries else 0.0,
        num_cached_blocks=cache.num_cached_blocks if cache is not None else 0,
        num_evicted_blocks=cache.num_evicted_blocks if cache is not None else 0,
        num_computed_tokens=s.num_computed_tokens,
        num_computed_prompt_tokens=s.num_computed_prompt_tokens,
        num_copied_blocks=kv.num_copied_blocks,
        num_swap_preemptions=s.num_swap_preemptions,
        num_swapped_out_blocks=swap.num_swapped_out_blocks,
        num_swapped_in_blocks=swap.num_swapped_in_blocks,
        num_cpu_blocks=swap.num_blocks,
        num_free_cpu_blocks=swap.num_free_blocks,
        kv_waste_fraction=waste.waste_fraction,
        kv_waste_fraction_prealloc_max_model_len=waste.prealloc_max_model_len_waste_fraction,
        kv_waste_fraction_prealloc_max_tokens=waste.prealloc_max_tokens_waste_fraction,
    )


def _load_tokenizer(config: EngineConfig) -> Any:
    """The checkpoint's tokenizer; None (token-id prompts only, no text) when the model folder
    has none and no other tokenizer was named, e.g. a config.json alone with --load-format dummy."""
    path = config.model.tokenizer
    if path == config.model.model and os.path.isdir(path) and not has_tokenizer_files(path):
        logger.warning(
            "No tokenizer files in %r: running without a tokenizer. Prompts must be token ids "
            "({'prompt_token_ids': [...]}) and outputs carry no text; pass --tokenizer to add one.",
            path,
        )
        return None
    return get_tokenizer(path)
