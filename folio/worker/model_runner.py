"""ModelRunner: turns a SchedulerOutput into one forward pass and the sampled tokens.

`launch` queues a step's device work and the copies of its results to the host, and returns
at once with a PendingOutput; `execute_model` is launch + wait. Between a launch and its wait
the engine may plan and launch the next step (async scheduling): its placeholder input ids are
gathered on the device from this step's sampled ids (worker/sampled_ids.py). Everything runs on
one CUDA stream, so each step's block moves, cache writes and reads come after the previous
step's, whatever the host has done meanwhile.

A launch has two halves: launch_forward (block moves, the forward pass) here, and
launch_sampling (logits, sampling, drafts, prompt log-probs) in worker/step_sampling.py.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch

from folio.attention import get_attention_backend
from folio.config import EngineConfig
from folio.core.outputs import ModelRunnerOutput
from folio.core.scheduler_output import SchedulerOutput
from folio.kernels import argmax, cudnn_prefill
from folio.logger import init_logger
from folio.lora.manager import LoRAManager
from folio.models.loader import load_model
from folio.parallel import all_reduce_min, get_tp_rank, get_tp_size
from folio.worker import step_broadcast
from folio.sample.sampler import Sampler
from folio.worker import block_ops
from folio.worker.allocation import named_allocation
from folio.worker import kv_cache as kvc
from folio.worker.chunk_graphs import chunk_graph_bytes, chunk_graph_cap, chunk_graph_keys, chunk_step_shape
from folio.worker.cuda_graphs import GRAPH_MEMORY_RESERVE, CudaGraphRunner, decode_graph_sizes
from folio.worker.pending_output import PendingOutput
from folio.worker.per_token_steps import read_budget, takes_per_token_step
from folio.worker.sampled_ids import DeviceSampledIds
from folio.worker.staged_step import StagedStep
from folio.worker.step_inputs import StepInputBuilder
from folio.worker.step_sampling import StepSampling

if TYPE_CHECKING:
    from folio.spec_decode.speculator import Speculator

logger = init_logger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner(StepSampling):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device.device)
        self.dtype = _TORCH_DTYPES[config.model.dtype]
        self.block_size = config.cache.block_size
        self.attn_backend = get_attention_backend(config.model.attention_backend, self.device.type)
        self.model = load_model(config.model, self.device, self.attn_backend)
        self.lora = self._wrap_lora(config)  # None unless enable_lora
        self.vocab_size = config.model.vocab_size
        self.sampler = Sampler(config.model.seed, self.device)
        self.speculator = make_speculator(config, self.device, self.attn_backend)
        self.kv_spec = kvc.KVCacheSpec(
            num_layers=len(self.model.attention_layers()),
            block_size=self.block_size,
            num_kv_heads=self._kv_heads_per_rank(),
            head_dim=config.model.head_dim,
            dtype=torch.float8_e4m3fn if config.cache.fp8 else self.dtype,
            extra_bytes_per_block=self.speculator.proposer.kv_bytes_per_block if self.speculator else 0,
        )
        # Token reads a layer a small prompt step may add to replay a decode graph (per_token_steps.py).
        self.per_token_budget = read_budget(self.kv_spec.bytes_per_token_layer)
        if config.cache.fp8:
            self._log_fp8_kv_scales()
        self.kv_cache: torch.Tensor | None = None  # [layers, 2, blocks, block_size, kv_heads, dim]
        # CPU blocks for preemption by swap (allocated, pinned on a GPU, on the first swap-out).
        self.swap_pool = block_ops.SwapPool.for_config(self.kv_spec, config, self.device)
        sched = config.scheduler
        with named_allocation("the step buffers", "max_num_batched_tokens", "max_num_seqs"):
            self.inputs = StepInputBuilder(
                sched.max_num_batched_tokens, sched.max_num_seqs, sched.max_model_len, self.block_size, self.device
            )
        self.graphs: CudaGraphRunner | None = None  # captured once the KV cache exists
        self.chunk_keys = self._chunk_graph_keys()  # (chunk tokens, decode slots) of the chunk graphs
        self.graph_reserve = GRAPH_MEMORY_RESERVE  # memory the KV sizing leaves the graphs (profiled on a GPU)
        # Per-request state that must outlive preemption: seeded generators, prompt-logprob progress.
        self.generators: dict[str, torch.Generator] = {}
        self.prompt_logprobs_done: dict[str, int] = {}
        self.last_sampled = DeviceSampledIds(self.device)
        # Rank 0 of several: each launched step is broadcast to the followers (parallel/follower.py).
        self.leads_followers = False

    def _kv_heads_per_rank(self) -> int:
        """KV heads this rank caches: its attention layers' share (all of them at tp=1)."""
        layers = self.model.attention_layers()
        return layers[0].num_kv_heads if layers else self.config.model.num_kv_heads

    def _wrap_lora(self, config: EngineConfig) -> LoRAManager | None:
        """Multi-LoRA: wrap the loaded model's linear layers around GPU adapter slots."""
        if config.lora is None:
            return None
        with named_allocation("the LoRA adapter slots", "max_loras", "max_lora_rank"):
            manager = LoRAManager(config.lora, config.scheduler.max_num_batched_tokens, self.device, self.dtype)
            manager.wrap(self.model)
        return manager

    # ---- KV cache ---------------------------------------------------------------------------
    def _log_fp8_kv_scales(self) -> None:
        scales = {(a.k_scale_value, a.v_scale_value) for a in self.model.attention_layers()}
        source = "1.0 (the checkpoint has none)" if scales == {(1.0, 1.0)} else "from the checkpoint"
        logger.info("KV cache in FP8 (e4m3), per-tensor k/v scales %s", source)

    def determine_num_blocks(self) -> int:
        override = self.config.cache.num_gpu_blocks_override
        if override is not None:
            num_blocks, source = override, "num_gpu_blocks_override"
        elif self.device.type == "cuda":
            num_blocks, source = self._profile_gpu_blocks(), "profiled"
        else:
            num_blocks = kvc.cpu_num_blocks(self.kv_spec, self.config)
            source = f"CPU budget {self.config.cache.cpu_kv_cache_space_gib:g} GiB"
        if get_tp_size() > 1:  # every rank must hold the same block ids: the smallest cache wins
            own, num_blocks = num_blocks, all_reduce_min(num_blocks, self.device)
            source += f", {own} on rank {get_tp_rank()}, minimum over {get_tp_size()} ranks"
        kvc.check_fits_one_sequence(num_blocks, self.config)
        kvc.log_kv_cache_decision(num_blocks, self.kv_spec, self.config, source)
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate and bind the KV cache, then capture the decode graphs (they bake in its
        address: a cache bound later needs a new capture)."""
        with named_allocation(f"the KV cache ({num_blocks} blocks)", *self._kv_cache_flags()):
            self.kv_cache = kvc.allocate_kv_cache(self.kv_spec, num_blocks, self.device)
        self.model.bind_kv_caches(list(self.kv_cache.unbind(0)))
        if self.speculator is not None:
            self.speculator.initialize_kv_cache(num_blocks, self.swap_pool.num_blocks)
        if self.uses_cuda_graphs():
            sizes = decode_graph_sizes(self.config.scheduler.max_num_seqs, self.config.scheduler.max_num_batched_tokens)
            self.graphs = CudaGraphRunner(self.model, self.inputs, sizes, self.lora, self.chunk_keys)
            self.graphs.capture(self.graph_reserve)
            if self.speculator is not None:
                self.speculator.capture_graphs(self.inputs, sizes)
            # batch-1 greedy's kernels, for the logits the sampler gets (the LM head's dtype)
            argmax.warm_up(self.config.model.vocab_size, self.device, self.dtype)

    def _kv_cache_flags(self) -> tuple[str, ...]:
        """The arguments that sized the KV cache."""
        if self.config.cache.num_gpu_blocks_override is not None:
            return ("num_gpu_blocks_override",)
        return ("cpu_kv_cache_space",) if self.device.type == "cpu" else ("gpu_memory_utilization",)

    def uses_cuda_graphs(self) -> bool:
        """Decode steps replay CUDA graphs unless enforce_eager, off CUDA, or on the torch
        attention backend (it loops over host lists, which a graph would freeze)."""
        return (
            self.device.type == "cuda"
            and not self.config.model.enforce_eager
            and self.attn_backend.name == "triton"
        )

    def _chunk_graph_keys(self) -> list[tuple[int, int]]:
        """The chunk graphs to capture (worker/chunk_graphs.py): none without CUDA graphs, and
        none with a speculator (its steps keep their own rules)."""
        if not self.uses_cuda_graphs() or self.speculator is not None:
            return []
        sched = self.config.scheduler  # a chunk never holds more than either
        cap = chunk_graph_cap(self.config.model, min(sched.max_num_batched_tokens, sched.max_model_len), get_tp_size())
        if getattr(self.attn_backend, "cudnn_prefill", False):  # opt-in cuDNN takes chunks from MIN_CHUNK
            cap = min(cap, cudnn_prefill.MIN_CHUNK - 1)  # up, reading the context length on the host
        return chunk_graph_keys(cap, sched.max_num_seqs, sched.max_num_batched_tokens)

    def _profile_gpu_blocks(self) -> int:
        """Run the largest step the scheduler can issue, then give the rest of the budget to KV."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with named_allocation("a step of max_num_batched_tokens tokens (the memory profile)",
                              "max_num_batched_tokens", "max_num_seqs"):
            self.profile_run()
        torch.cuda.synchronize()
        peak_torch = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        non_torch = (total - free) - torch.cuda.memory_reserved()
        budget = total * self.config.cache.gpu_memory_utilization - peak_torch - max(non_torch, 0)
        if self.uses_cuda_graphs():
            self.graph_reserve = GRAPH_MEMORY_RESERVE + chunk_graph_bytes(
                self.config.model, self.chunk_keys, self.dtype.itemsize, get_tp_size())
            budget -= self.graph_reserve
        torch.cuda.empty_cache()
        logger.info(
            "Memory profile: peak %.2f GiB by torch, %.2f GiB outside torch, KV budget %.2f GiB",
            peak_torch / 2**30,
            non_torch / 2**30,
            budget / 2**30,
        )
        if budget <= 0:
            raise ValueError(
                "No GPU memory is left for the KV cache after the model and its activations; "
                "raise gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs."
            )
        return kvc.num_blocks_for_budget(self.kv_spec, int(budget), self.config)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward pass at the step-size maxima through a throwaway cache just big enough."""
        from folio.worker.dummy_batch import dummy_scheduler_output

        so = dummy_scheduler_output(self.config)
        blocks_needed = sum(len(s.block_ids) for s in so.scheduled)
        cache = kvc.allocate_kv_cache(self.kv_spec, blocks_needed, self.device)
        self.model.bind_kv_caches(list(cache.unbind(0)))
        speculator, self.speculator = self.speculator, None  # the draft's K/V does not exist yet
        try:
            self.execute_model(so)
        finally:
            self.speculator = speculator
            self.model.bind_kv_caches([None] * self.kv_spec.num_layers)  # type: ignore[list-item]
            self.generators.clear()
            self.prompt_logprobs_done.clear()
            self.last_sampled.record(None, [], [])
            self.inputs.forget(tuple(s.request_id for s in so.scheduled))
            del cache

    # ---- one step ---------------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.launch(scheduler_output).result()

    @torch.inference_mode()
    def launch(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Queue the step (block moves, forward, sampling, copies to the host) without waiting.

        Reads the scheduled requests' state now: call it right after schedule(), before the
        update of any earlier step changes their tokens.
        """
        return self.launch_sampling(self.launch_forward(scheduler_output))

    @torch.inference_mode()
    def launch_forward(self, scheduler_output: SchedulerOutput) -> StagedStep:
        """The first half of launch: block moves and the forward pass. Sampling waits for
        launch_sampling, so the engine can first bring grammar states up to date with the
        previous step's tokens (structured outputs under async scheduling)."""
        self._forget(scheduler_output.finished_req_ids)
        self.inputs.forget(scheduler_output.preempted_req_ids)
        self.inputs.forget(scheduler_output.shrunk_req_ids)
        self._move_blocks(scheduler_output)
        scheduled = scheduler_output.scheduled
        pending = PendingOutput([s.request_id for s in scheduled])
        if not scheduled:
            if self.leads_followers and step_broadcast.block_moves(scheduler_output) != ((), (), ()):
                step_broadcast.send_moves_only(scheduler_output, self.device)
            self.last_sampled.record(None, [], [])
            return StagedStep(scheduled, None, None, pending)
        per_token_seqs = self._is_small_verify_step(scheduler_output) or self._is_small_graph_step(scheduler_output)
        bucket = self._graph_bucket(scheduler_output, per_token_seqs)
        chunk = self._chunk_bucket(scheduler_output) if bucket is None and not per_token_seqs else None
        inputs = self.inputs.build(scheduler_output, self.prompt_logprobs_done,
                                   pad_to=bucket if chunk is None else 1 + chunk[1], per_token_seqs=per_token_seqs,
                                   pad_tokens_to=None if chunk is None else sum(chunk))
        base_only = self.lora is None or not self.lora.prepare_step(scheduled, inputs.input_ids.shape[0]).any_adapter
        if inputs.placeholder_rows:
            request_ids = [scheduled[i].request_id for i in inputs.placeholder_batch_indices]
            self.last_sampled.fill(inputs.input_ids, inputs.placeholder_rows, request_ids)
        if inputs.pending_drafts and self.speculator is not None:
            self.speculator.fill_drafts(inputs)
        if self.leads_followers:
            step_broadcast.send_step_plan(inputs, bucket, scheduler_output, self.block_size, self.device, chunk)
        if chunk is not None and self.graphs is not None:
            hidden = self.graphs.replay_chunk(chunk)  # [chunk tokens + decode slots, hidden]
        elif bucket is not None and self.graphs is not None:
            hidden = self.graphs.replay(bucket, base_only)  # [bucket, hidden]
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata)
        drafts = False
        if self.speculator is not None:  # decides now whether this step drafts (see StagedStep)
            drafts = self.speculator.observe(scheduled, inputs)
        return StagedStep(scheduled, inputs, hidden, pending, drafts)

    def _move_blocks(self, scheduler_output: SchedulerOutput) -> None:
        """Swap-outs, copy-on-write copies and swap-ins the scheduler asked for, in that order,
        before this step's forward (worker/block_ops.py)."""
        so = scheduler_output
        if so.blocks_to_copy or so.blocks_to_swap_out or so.blocks_to_swap_in:
            assert self.kv_cache is not None
            block_ops.apply_block_moves(self.kv_cache, self.swap_pool, so)
            if self.speculator is not None:
                self.speculator.move_blocks(so)

    def _forget(self, request_ids: frozenset[str]) -> None:
        self.inputs.forget(request_ids)
        if self.speculator is not None:
            self.speculator.forget(request_ids)
        for request_id in request_ids:
            self.generators.pop(request_id, None)
            self.prompt_logprobs_done.pop(request_id, None)

    def shutdown_followers(self) -> None:
        """Tell the followers to leave their loops (rank 0, once, at engine shutdown)."""
        if self.leads_followers:
            self.leads_followers = False
            step_broadcast.send_stop(self.device)
        self.release_graphs()

    def release_graphs(self) -> None:
        """Free the CUDA graphs (before the NCCL communicator their all-reduces use goes)."""
        if self.graphs is not None:
            self.graphs = None
            gc.collect()
            torch.cuda.synchronize()

    def _graph_bucket(self, scheduler_output: SchedulerOutput, per_token_seqs: bool) -> int | None:
        """The captured batch size to replay: a decode-only step's number of requests, or a
        verify step's number of tokens when each is its own sequence (_is_small_verify_step)."""
        if self.graphs is None:
            return None
        num_seqs = len(scheduler_output.scheduled)
        if per_token_seqs:
            return self.graphs.bucket_for(scheduler_output.total_num_scheduled_tokens)
        if scheduler_output.total_num_scheduled_tokens != num_seqs:
            return None
        return self.graphs.bucket_for(num_seqs)

    def _chunk_bucket(self, scheduler_output: SchedulerOutput) -> tuple[int, int] | None:
        """The chunk graph (chunk tokens, decode slots) to replay for a step of one request's
        prompt chunk, alone or beside decodes (chunk_graphs.py)."""
        if self.graphs is None or not self.graphs.chunk_graphs:
            return None
        if self.lora is not None and any(s.request.lora_request for s in scheduler_output.scheduled):
            return None  # chunk graphs have no LoRA kernels: such a step runs eagerly, unpadded
        shape = chunk_step_shape(scheduler_output)
        return None if shape is None else self.graphs.chunk_bucket_for(*shape)

    def _is_small_graph_step(self, scheduler_output: SchedulerOutput) -> bool:
        """A small step with prompt tokens that a decode CUDA graph can replay as per-token
        sequences (worker/per_token_steps.py); never with a speculator (its verify steps have
        their own rule) or without graphs (eager per-token attention would only cost reads)."""
        if self.graphs is None or self.speculator is not None:
            return False
        return takes_per_token_step(scheduler_output, max(self.graphs.graphs, default=0), self.per_token_budget)

    def _is_small_verify_step(self, scheduler_output: SchedulerOutput) -> bool:
        """A speculative step of decodes and verifies only (no prompt tokens), with drafts and
        at most max_num_seqs tokens: its attention runs as one decode sequence per token
        (worker/step_inputs.py), which a decode CUDA graph replays."""
        so = scheduler_output
        if self.speculator is None or so.total_num_scheduled_tokens > self.inputs.max_num_seqs:
            return False
        if so.total_num_scheduled_tokens == len(so.scheduled):
            return False  # plain decode
        return all(s.num_new_tokens == 1 + len(s.spec_token_ids) for s in so.scheduled)


def make_speculator(config: EngineConfig, device: torch.device, attn_backend) -> Speculator | None:  # noqa: ANN001
    """The proposer and verifier of speculative decoding, when the config asks for it."""
    if config.speculative is None:
        return None
    from folio.spec_decode.speculator import Speculator

    return Speculator(config, device, attn_backend)
