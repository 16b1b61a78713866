"""CudaGraphRunner: decode steps replayed from CUDA graphs captured at bucketed batch sizes.

A decode step of the 0.6B model launches ~360 small kernels; launched one by one from Python
the host, not the GPU, sets the pace. A graph replays them all with one launch.

- Buckets: 1, 2, 4, then multiples of 8 up to max_num_seqs (and max_num_seqs itself). A step of
  n sequences replays the smallest bucket >= n; the StepInputBuilder pads the batch to it
  (padded sequences have query length 0 and seq_len 0; padded slots are -1).
- Every graph reads the StepInputBuilder's persistent device buffers, so a replay needs only the
  host-to-device copies that build() already makes. The attention grid depends only on the
  padded batch size (the split count too, see folio/kernels/paged_decode.py), so one graph per
  bucket is valid for every context length.
- Each bucket is run once eagerly before its capture, so Triton compiles (and cuBLAS picks its
  kernels) outside the capture. Graphs share one memory pool, captured largest first.
- Only the forward pass is captured; the LM head and sampling run eagerly after it.
- Small steps with prompt tokens (a short prompt alone, or among decodes) replay these graphs
  too, laid out as one decode sequence per token (worker/per_token_steps.py).
- LoRA: the layers read the manager's persistent token -> slot buffers. Each bucket has two
  graphs: one captured with the LoRA kernels launched (for steps where some request has an
  adapter; slots without tokens find their group empty) and one without them (for steps where
  none has: W1 on Llama-3.1-8B lost 5% to those empty launches), sharing the pool.
- Chunk graphs (worker/chunk_graphs.py): one request's prompt chunk, alone or beside decodes,
  captured at (chunk tokens, decode slots) keys (StepInputBuilder.chunk_capture_inputs), replayed
  for any step that fits one (build(pad_to=..., pad_tokens_to=...)). Captured first, in the same
  pool; with LoRA only without the LoRA kernels (steps where an adapter is active run eagerly).
- Off with enforce_eager, and whenever the attention backend is not Triton (the torch reference
  loops over host lists, which a graph would freeze).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import time
from collections.abc import Iterator

import torch
from tqdm import tqdm

from folio.core.scheduler_output import SchedulerOutput
from folio.logger import init_logger
from folio.lora.manager import LoRAManager
from folio.models.base import CausalLM
from folio.worker.step_inputs import StepInputBuilder, StepInputs

logger = init_logger(__name__)

# Room the KV profiling leaves for the graphs' memory pool (activations of a max_num_seqs-token
# decode step plus split-KV partials: tens of MiB for the models we serve) and the kernels that
# are compiled during capture. The capture logs what it really took.
GRAPH_MEMORY_RESERVE = 512 << 20


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: tuple[int, int] | None) -> Iterator[None]:
    """torch.cuda.graph, made safe against what else runs in the process: the capture checks only
    its own thread's CUDA calls (torch's default mode also fails on another thread's, such as a
    second engine's or a memory query's), and the cyclic garbage collector stays off while it
    records, so no finalizer of an earlier engine's CUDA objects (events, graphs) runs inside the
    capture and invalidates it. torch collects garbage on entry. One GPU test run (session 20) saw
    a capture invalidated after other engines had come and gone in the process; which of the two
    did it was not pinned down (it did not happen again in three runs), so both are guarded."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            yield
    finally:
        if was_enabled:
            gc.enable()


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """[1, 2, 4, 8, 16, 24, ..., max_num_seqs]: all <= max_num_seqs, max_num_seqs included."""
    sizes = {s for s in (1, 2, 4) if s <= max_num_seqs}
    sizes.update(range(8, max_num_seqs + 1, 8))
    sizes.add(max_num_seqs)
    return sorted(sizes)


def decode_graph_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """The runner's buckets: a graph of n sequences feeds n tokens, so the token budget bounds
    them too (max_num_batched_tokens may be set below max_num_seqs)."""
    return graph_batch_sizes(min(max_num_seqs, max_num_batched_tokens))


class CudaGraphRunner:
    def __init__(
        self, model: CausalLM, builder: StepInputBuilder, batch_sizes: list[int], lora: LoRAManager | None = None,
        chunk_keys: list[tuple[int, int]] | None = None,
    ) -> None:
        self.model = model
        self.lora = lora  # LoRA layers read its mapping buffers; captured with the kernels on
        self.builder = builder
        self.batch_sizes = sorted(batch_sizes)
        self.chunk_keys = sorted(chunk_keys or [])  # (chunk tokens, decode slots)
        self.chunk_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.chunk_outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._pool: tuple[int, int] | None = None  # the graphs' shared memory pool, from the first capture
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # bucket -> [bucket, hidden], in the pool
        # With LoRA: the same without the LoRA kernels, for steps where no request has an adapter.
        self.base_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.base_outputs: dict[int, torch.Tensor] = {}

    def bucket_for(self, num_seqs: int) -> int | None:
        """The smallest captured batch size that holds num_seqs, or None (run eagerly)."""
        i = bisect.bisect_left(self.batch_sizes, num_seqs)
        if i == len(self.batch_sizes) or self.batch_sizes[i] not in self.graphs:
            return None
        return self.batch_sizes[i]

    def chunk_bucket_for(self, num_tokens: int, num_decodes: int = 0) -> tuple[int, int] | None:
        """The chunk graph with the fewest padded tokens that holds a num_tokens chunk beside
        num_decodes decodes, on a tie the one with fewer decode slots (fewer empty sequences, and
        a chunk alone keeps the long-chunk kernels), or None (run eagerly)."""
        fits = [(t + d, d, t) for t, d in self.chunk_graphs if t >= num_tokens and d >= num_decodes]
        if not fits:
            return None
        _, d, t = min(fits)
        return t, d

    @torch.inference_mode()
    def capture(self, reserve: int = GRAPH_MEMORY_RESERVE) -> None:
        """Capture the chunk graphs, then the decode graphs, each set largest first (the rest reuse
        the pool); reserve: the memory the KV sizing left for them (a warning past it)."""
        start = time.perf_counter()
        torch.cuda.synchronize()
        free_before, _ = torch.cuda.mem_get_info()
        self._pool = None
        jobs = [(key, sum(key)) for key in sorted(self.chunk_keys, key=sum, reverse=True)]
        jobs += [(None, size) for size in reversed(self.batch_sizes)]
        for key, size in tqdm(jobs, desc="Capturing CUDA graphs", dynamic_ncols=True):
            if key is not None:
                self.chunk_graphs[key], self.chunk_outputs[key] = self._capture_one(
                    self.builder.chunk_capture_inputs(*key), size, with_lora=False)
                continue
            inputs = self.builder.build(SchedulerOutput([], 0), {}, pad_to=size)
            for with_lora in (True, False) if self.lora is not None else (True,):
                graphs, outputs = (self.graphs, self.outputs) if with_lora else (self.base_graphs, self.base_outputs)
                graphs[size], outputs[size] = self._capture_one(inputs, size, with_lora)
        torch.cuda.synchronize()
        free_after, _ = torch.cuda.mem_get_info()
        used = free_before - free_after
        mixed = sum(1 for _, d in self.chunk_graphs if d)
        chunks = (f" and {len(self.chunk_graphs)} for prompt chunks of {self.chunk_keys[0][0]}.."
                  f"{max(t for t, _ in self.chunk_keys)} tokens ({mixed} of them beside up to "
                  f"{max(d for _, d in self.chunk_keys)} decodes)" if self.chunk_keys else "")
        logger.info("Captured %d CUDA graphs for decode batch sizes %d..%d%s in %.1f s, using %.2f GiB",
                    len(self.graphs) + len(self.base_graphs), self.batch_sizes[0], self.batch_sizes[-1], chunks,
                    time.perf_counter() - start, used / 2**30)
        if used > reserve:
            logger.warning(
                "CUDA graphs took %.2f GiB, more than the %.2f GiB the KV sizing left for them; "
                "lower gpu_memory_utilization if memory runs out.",
                used / 2**30,
                reserve / 2**30,
            )

    def _capture_one(self, inputs: StepInputs, size: int, with_lora: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """One graph of the model's forward on these inputs, after an eager run (compiles, cuBLAS's
        choices) outside the capture; with_lora: the LoRA kernels launched (LoRA only)."""
        args = (inputs.input_ids, inputs.positions, inputs.attn_metadata)
        if self.lora is not None:
            self.lora.prepare_capture(size, with_kernels=with_lora)
        self.model(*args)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, self._pool):
            output = self.model(*args)
        self._pool = graph.pool() if self._pool is None else self._pool
        return graph, output

    def replay(self, bucket: int, base_only: bool = False) -> torch.Tensor:
        """Run the captured forward on what build(pad_to=bucket) just wrote: [bucket, hidden].
        base_only: no request of the step has a LoRA adapter (the graph without LoRA kernels)."""
        if base_only and bucket in self.base_graphs:
            self.base_graphs[bucket].replay()
            return self.base_outputs[bucket]
        self.graphs[bucket].replay()
        return self.outputs[bucket]

    def replay_chunk(self, key: tuple[int, int]) -> torch.Tensor:
        """Run the chunk graph on what build(pad_to=1 + d, pad_tokens_to=t + d) just wrote, for
        key (t, d): [t + d, hidden]."""
        self.chunk_graphs[key].replay()
        return self.chunk_outputs[key]
