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
- structured outputs: a grammar's mask for step N+1 depends on step N's token. When step N+1
  samples a row with a grammar, its forward pass is launched, then the host waits for step N,
  advances the grammars with its tokens (update_from_output), and only then fills the masks and
  launches step N+1's sampling: the forward pass of N+1 still overlaps the host's work on N;
- speculative decoding: a step that verifies drafts or proposes them decides where the next
  step starts (how many drafts were accepted), so nothing is launched ahead of it. A step of a
  paused speculator (disable_by_batch_size, or a verify step too big for any CUDA graph) does
  neither and runs ahead like any other; a step launched ahead that will propose drafts waits,
  as a grammar does, for the previous step's update before it samples and drafts, so the
  proposer reads each request's whole history;
- when step() returns with nothing left to run, nothing is in flight.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Iterable
from typing import Any

from folio.config import EngineConfig
from folio.config.generation import SAMPLING_DEFAULTS  # generation_config.json keys, vLLM's
from folio.core.engine_state import build_engine_state
from folio.core.request import RequestStatus
from folio.core.outputs import ModelRunnerOutput
from folio.core.scheduler import Scheduler
from folio.core.scheduler_output import SchedulerOutput
from folio.engine.arg_utils import EngineArgs
from folio.engine.beam_search import BeamSearchManager, BeamSearchParams
from folio.engine.engine_stats import EngineStats, collect_stats
from folio.engine.input_processor import InputProcessor, PromptType, check_priority
from folio.engine.output_processor import OutputProcessor
from folio.logger import init_logger
from folio.lora.request import LoRARequest
from folio.outputs import RequestOutput
from folio.parallel.launch import Lead, lead
from folio.sampling_params import SamplingParams, SamplingParamsError
from folio.structured_output.manager import StructuredOutputManager, UnsatisfiableConstraintError
from folio.transformers_utils.tokenizer import eos_token_ids, load_model_tokenizer
from folio.worker.model_runner import ModelRunner, StagedStep
from folio.worker.pending_output import PendingOutput

logger = init_logger(__name__)

class LLMEngine:
    def __init__(self, config: EngineConfig, max_logprobs: int = 20) -> None:
        start = time.perf_counter()
        self.config = config
        self.tokenizer = load_model_tokenizer(config.model.model, config.model.tokenizer,
                                              config.model.skip_tokenizer_init)
        # Tensor parallelism: this process is rank 0; workers repeat each step (parallel/).
        self._tp: Lead | None = lead(config) if config.parallel.tensor_parallel_size > 1 else None
        try:
            self.runner = ModelRunner(config)
            self.num_blocks = self.runner.determine_num_blocks()
            self.runner.initialize_kv_cache(self.num_blocks)
        except BaseException:
            if self._tp is not None:
                self._tp.abandon()
            raise
        self.runner.leads_followers = self._tp is not None
        # Stops the workers when shutdown() is called, the engine is collected, or Python exits.
        self._stop_tp = weakref.finalize(self, self._tp.stop, self.runner.shutdown_followers) if self._tp else None
        self.scheduler = Scheduler(
            config.scheduler,
            self.num_blocks,
            config.cache.block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            num_cpu_blocks=self.runner.swap_pool.num_blocks,
            max_loras=config.lora.max_loras if config.lora is not None else None,
            num_lookahead_tokens=self.runner.speculator.num_lookahead_tokens if self.runner.speculator else 0,
        )
        if self.runner.lora is not None:  # adapters of unfinished requests stay in the CPU cache
            self.runner.lora.in_use = self._loras_in_use
        eos = eos_token_ids(self.tokenizer, config.model.generation_config)
        self.input_processor = InputProcessor(config.model, self.tokenizer, eos, max_logprobs)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.structured_output = StructuredOutputManager(
            config.structured_outputs, self.tokenizer, config.model.vocab_size, eos
        )
        self.beam_search = BeamSearchManager(self.scheduler, self.tokenizer, eos, config.model.max_model_len)
        self._request_errors: dict[str, Exception] = {}
        self._pooler = None  # worker.pooler.Pooler, made on the first embed()
        self.async_scheduling = config.scheduler.async_scheduling
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
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request; raises ValueError (nothing queued) if anything about it is invalid.
        With a LoRARequest it runs with that adapter (loaded and checked now if new).

        With BeamSearchParams the request is a beam search: one RequestOutput when it is done,
        its beam_width best sequences as completions, best first (engine/beam_search.py)."""
        if request_id in self.output_processor.requests or request_id in self.beam_search.searches:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        check_priority(priority, self.config.scheduler.policy)
        params = params if params is not None else self.default_sampling_params()
        processed = self.input_processor.process_request(prompt, params)  # before an adapter loads
        grammar_spec = None if isinstance(params, BeamSearchParams) else self.structured_output.check(params)
        if lora_request is not None:
            self.add_lora(lora_request)
            processed = dataclasses.replace(processed, lora_request=lora_request)
        if isinstance(params, BeamSearchParams):
            self._log_no_speculation(request_id, "beam search")
            self.beam_search.add(request_id, processed, params, arrival_time, priority)
            return
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
        if grammar_spec is not None:  # to the scheduler once its grammar is compiled
            self.structured_output.park(request_id, requests, grammar_spec)
            return
        if not requests[0].can_speculate:
            self._log_no_speculation(request_id, requests[0].no_speculation_reason or "")
        try:
            for request in requests:
                self.scheduler.add_request(request)
        except Exception:  # nothing of the request may stay behind to fail the next ones
            self.abort_request(request_id)
            raise

    def _log_no_speculation(self, request_id: str, reason: str) -> None:
        if self.config.speculative is not None:
            logger.info("Request %s: no speculative decoding with %s.", request_id, reason)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        core_ids = self.output_processor.abort_requests(ids)
        self.scheduler.finish_requests(core_ids, RequestStatus.FINISHED_ABORTED)
        self.beam_search.abort(ids)
        self.structured_output.abort(ids)
        self._settle_if_idle()  # rather than at the next request's first step

    def step(self) -> list[RequestOutput]:
        """The outputs of one step. With async scheduling the next step is running on the
        device when this returns, unless nothing is left to run or a request needs
        synchronous steps."""
        try:
            if self._tp is None:
                return self._step()
            return self._tp_step(self._tp.workers)
        except Exception:
            # Blocks registered in the failed step (or the one in flight beside it) may hold no
            # K/V: nothing cached is trusted; running tables keep their blocks, uncached.
            cache = self.scheduler.kv_cache_manager.prefix_cache
            if cache is not None:
                cache.clear()
            raise

    def _tp_step(self, workers) -> list[RequestOutput]:  # noqa: ANN001 (parallel's WorkerGroup)
        workers.check()
        workers.busy = True
        try:
            return self._step()
        except Exception as e:
            workers.check(wait_s=2.0)  # a dead worker explains a failed collective
            raise e
        finally:
            workers.busy = False

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers and leave the group (no-op on one device)."""
        if self._stop_tp is not None:
            self._stop_tp()

    def _step(self) -> list[RequestOutput]:
        self._admit_compiled()
        if not self.async_scheduling:
            scheduler_output = self.scheduler.schedule()
            outputs = self._finish_step(scheduler_output, self.runner.execute_model(scheduler_output))
            self._log_spec_stats_if_idle()
            return outputs
        current = self._in_flight or self._launch()
        self._in_flight, staged = None, None
        # A step that verified or drafted decides where the next one starts: no launch ahead.
        if not self.scheduler.requires_sync_steps and not current[1].speculative:
            staged = self._launch_forward()
            if not staged[1].waits_for_previous:
                self._in_flight, staged = (staged[0], self.runner.launch_sampling(staged[1])), None
        try:
            outputs = self._finish_step(current[0], current[1].result())
        finally:
            if staged is not None:  # the grammars and drafts see the current step's tokens now
                self._in_flight = (staged[0], self.runner.launch_sampling(staged[1]))
        self._settle_if_idle()
        self._log_spec_stats_if_idle()
        return outputs

    def _log_spec_stats_if_idle(self) -> None:
        """Speculative decoding's counters, once each time the engine runs out of work."""
        stats = self.scheduler.spec_stats
        if stats.num_drafts != self._spec_drafts_logged and not self.scheduler.has_unfinished_requests():
            self._spec_drafts_logged = stats.num_drafts
            logger.info("Speculative decoding so far: %s", stats.summary())
    def _admit_compiled(self) -> None:
        """Hand the scheduler the requests whose structured-output grammar is now compiled;
        fail those whose compile failed. With nothing else to run, wait briefly for one."""
        manager = self.structured_output
        if not manager.has_parked:
            return
        if self._in_flight is None and not self.scheduler.has_unfinished_requests():
            manager.wait(timeout=0.05)
        ready = manager.take_ready()
        for request in ready.requests:
            self.scheduler.add_request(request)
        for request_id, _, error in ready.failed:
            logger.warning("The structured output of request %r failed: %s", request_id, error)  # the id: logs only
            message = (str(error) if isinstance(error, UnsatisfiableConstraintError)
                       else f"The structured output grammar failed to compile: {error}")
            # A ValueError is the grammar's own fault (a 400); else the server's (a 500, with a traceback)
            failure = SamplingParamsError("structured_outputs", message) if isinstance(error, ValueError) else RuntimeError(message)
            failure.__cause__ = error
            self.output_processor.fail_request(request_id, failure)

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

    def _launch_forward(self) -> tuple[SchedulerOutput, StagedStep]:
        scheduler_output = self.scheduler.schedule()
        return scheduler_output, self.runner.launch_forward(scheduler_output)

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

    # ---- LoRA adapters (vLLM's names) ---------------------------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load and check an adapter (ValueError if unusable); True once it is available."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}.")
        if self.runner.lora is None:
            raise ValueError("LoRA adapters need an engine started with enable_lora=True.")
        self.runner.lora.add_adapter(lora_request)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        """Forget an adapter; requests using it must have finished (ValueError otherwise)."""
        if self.runner.lora is None:
            return False
        if any(r.lora_int_id == lora_id for r in self.scheduler.requests.values()):
            raise ValueError(f"Adapter id {lora_id} is in use by unfinished requests.")
        # A step still in flight reads the slot before the zeroing queued behind it.
        return self.runner.lora.remove_adapter(lora_id)

    def _loras_in_use(self) -> set[int]:
        ids = {r.lora_int_id for r in self.scheduler.requests.values()}
        ids.update(s.prompt.lora_request.lora_int_id for s in self.beam_search.searches.values()
                   if s.prompt.lora_request is not None)
        return ids

    def list_loras(self) -> set[int]:
        return {r.lora_int_id for r in self.runner.lora.list_adapters()} if self.runner.lora else set()

    # ---- information ------------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the checkpoint's generation_config.json defaults applied."""
        gen = self.config.model.generation_config
        kwargs = {ours: gen[theirs] for theirs, ours in SAMPLING_DEFAULTS.items()
                  if theirs != "max_new_tokens" and gen.get(theirs) is not None}
        if isinstance(gen.get("max_new_tokens"), int):
            kwargs["max_tokens"] = gen["max_new_tokens"]
        try:
            return SamplingParams(**kwargs)
        except ValueError:
            logger.warning("Ignoring invalid sampling defaults in generation_config.json: %s", kwargs)
            return SamplingParams()

    def embed(self, prompts: list[list[int]], pooler_config: Any) -> list[list[float]]:
        """Embeddings of token prompts from the model's final hidden states (worker/pooler.py),
        computed now, between steps, over free blocks of the engine's KV cache, given back after."""
        from folio.pooling_params import PoolerConfig
        from folio.worker.pooler import pooler_for_runner

        if not isinstance(pooler_config, PoolerConfig):
            raise ValueError(f"pooler_config must be a PoolerConfig, got {type(pooler_config).__name__}.")
        if self._tp is not None:  # the followers run steps only: rank 0's forward alone would wait forever
            raise ValueError("Embeddings are not supported with tensor_parallel_size > 1 yet "
                             f"(this engine has {self.config.parallel.tensor_parallel_size}).")
        for ids in prompts:  # the same checks as a generation prompt's: ids in the vocabulary, length
            processed = self.input_processor.process_prompt({"prompt_token_ids": ids})
            self.input_processor.check_length(len(processed.token_ids))
        if self._pooler is None:
            self._pooler = pooler_for_runner(self.runner, self.scheduler.kv_cache_manager.block_pool)
        return self._pooler.embed(prompts, pooler_config)

    def engine_state(self, with_blocks: bool = False) -> dict[str, Any]:
        """The queues and KV cache as core/engine_state.py pictures them (docs/dashboard.md)."""
        return build_engine_state(self.scheduler, with_blocks=with_blocks)

    def stats(self) -> EngineStats:
        return collect_stats(self.scheduler, self.num_blocks, self.config.parallel.tensor_parallel_size,
                             self.num_blocks * self.runner.kv_spec.bytes_per_block)

