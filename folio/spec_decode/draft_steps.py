"""DraftSteps: a draft model's k greedy decode steps from persistent buffers, all k in one
replay of a CUDA graph once `capture` has run (on CUDA), else run eagerly from the same buffers.

Drafting k tokens is k forward passes of a small model: launched op by op from Python, the host
sets their pace (a 2-layer draft launches ~40 kernels a step), and at batch 1 the drafts could
cost more than the target's verify step saves. Here each bucketed batch size (the target's
decode buckets) has one captured graph of all k steps: forward, LM head, argmax, and the argmax
written back into the graph's own token buffer, so step j + 1 reads step j's draft without the
host. One graph rather than one per step: with a graph per step replayed k times in a row,
the H100 cProfile of batch-1 drafting (k = 4) had the host inside graph replays for 0.39 s of
0.47 s (1,032 replays, ~0.38 ms each, against ~0.01 ms for the target's replays without
speculation), so the engine's bookkeeping waited instead of overlapping the drafting; one
replay per call also saves k - 1 launches and 3 (k - 1) small copies.

Per call the host computes every step's positions, slots and sequence lengths at once (numpy,
[k, n]) into pinned buffers and copies them, the block table and the first tokens, then
replays once. A row past its limit (its table or max_model_len ends) gets slot -1 and seq_len 0
(attention skips it, nothing is written) and position 0; its drafts are dropped; a call for
fewer than k steps runs the rest as such dead rows. Without graphs (CPU, enforce_eager, the
torch attention backend) each step runs at the batch's own size with the host copies of the
sequence lengths that the torch backend loops over.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from folio.attention.metadata import AttentionMetadata
from folio.kernels.argmax import argmax_rows
from folio.logger import init_logger
from folio.models.base import CausalLM
from folio.worker.cuda_graphs import capturing

logger = init_logger(__name__)


class DraftSteps:
    def __init__(
        self, model: CausalLM, sizes: list[int], max_steps: int, block_size: int, max_blocks: int, device: torch.device
    ) -> None:
        self.model = model
        self.sizes = sorted(sizes)
        self.block_size = block_size
        self.max_blocks = max_blocks
        s = self.sizes[-1]
        self.max_steps = max_steps
        self.tokens = torch.zeros(s, dtype=torch.int64, device=device)
        self.positions = torch.zeros((max_steps, s), dtype=torch.int64, device=device)  # row j: step j
        self.slots = torch.full((max_steps, s), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros((max_steps, s), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(s + 1, dtype=torch.int32, device=device)  # one token each
        self.tables = torch.zeros((s, max_blocks), dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self.host_positions = torch.zeros((max_steps, s), dtype=torch.int64, pin_memory=pin)
        self.host_slots = torch.zeros((max_steps, s), dtype=torch.int64, pin_memory=pin)
        self.host_seq_lens = torch.zeros((max_steps, s), dtype=torch.int32, pin_memory=pin)
        self.host_tables = torch.zeros((s * max_blocks,), dtype=torch.int32, pin_memory=pin)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Set after each run's last copy from the pinned buffers: the next run waits for it
        # before rewriting them (today a host read always comes between two runs anyway).
        self._copied: torch.cuda.Event | None = None
        self.outputs: dict[int, torch.Tensor] = {}  # size -> [max_steps, size] argmax ids, in the pool

    def bucket_for(self, n: int) -> int | None:
        """The captured size that holds n rows, or None (then the steps run eagerly)."""
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) and self.sizes[i] in self.graphs else None

    def _metadata(self, size: int, j: int, seq_lens_cpu: list[int] | None = None) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=size,
            num_seqs=size,
            max_query_len=1,
            max_seq_len=self.max_blocks * self.block_size,
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[j, :size],
            block_tables=self.tables[:size],
            slot_mapping=self.slots[j, :size],
            query_start_loc_cpu=list(range(size + 1)),
            seq_lens_cpu=seq_lens_cpu if seq_lens_cpu is not None else [0] * size,  # the torch backend's
            is_decode_only=True,
        )

    def _step(self, size: int, j: int, seq_lens_cpu: list[int] | None = None) -> torch.Tensor:
        metadata = self._metadata(size, j, seq_lens_cpu)
        hidden = self.model(self.tokens[:size], self.positions[j, :size], metadata)  # [size, hidden]
        ids = argmax_rows(self.model.compute_logits(hidden))  # [size]
        self.tokens[:size].copy_(ids)
        return ids

    def _all_steps(self, size: int) -> torch.Tensor:  # [max_steps, size]
        return torch.stack([self._step(size, j) for j in range(self.max_steps)])

    @torch.inference_mode()
    def capture(self) -> None:
        """One graph of all max_steps steps per size, largest first, sharing one pool; slots
        are -1 and seq_lens 0 while capturing, so nothing is written to the cache."""
        pool = None
        for size in reversed(self.sizes):
            self._all_steps(size)  # compile and autotune outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, pool):
                self.outputs[size] = self._all_steps(size)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("Captured %d CUDA graphs for draft steps, batch sizes %d..%d", len(self.graphs), self.sizes[0], self.sizes[-1])

    @torch.inference_mode()
    def run(
        self, tokens: torch.Tensor, positions: list[int], tables: list[list[int]], limits: list[int], steps: int
    ) -> torch.Tensor:
        """Draft `steps` tokens for n rows: row i starts from tokens[i] at positions[i] and drafts
        limits[i] of them. Returns [steps, n] argmaxes (entries past a row's limit are garbage),
        on the device, without waiting for them. The pinned host buffers are rewritten by the
        next call only once this call's copies from them are done (an event)."""
        n = len(positions)
        assert steps <= self.max_steps and n <= self.sizes[-1]
        bucket = self.bucket_for(n)
        size = bucket or n
        rows = self.max_steps if bucket is not None else steps  # the graph runs every step
        if self._copied is not None:
            self._copied.synchronize()
        self._fill_host(positions, tables, limits, rows, size)
        width = max(len(t) for t in tables)
        table = self.host_tables[: n * width].view(n, width)
        self.tables[:n, :width].copy_(table, non_blocking=True)
        self.tokens[:n].copy_(tokens)
        for device_rows, host_rows in ((self.positions, self.host_positions), (self.slots, self.host_slots),
                                       (self.seq_lens, self.host_seq_lens)):
            device_rows[:rows].copy_(host_rows[:rows], non_blocking=True)  # whole rows: contiguous
        if bucket is None:
            out = torch.empty((steps, n), dtype=torch.int64, device=tokens.device)
            for j in range(steps):
                out[j].copy_(self._step(size, j, self.host_seq_lens[j, :size].tolist())[:n])
        else:
            self.graphs[size].replay()
            out = self.outputs[size][:steps, :n].clone()  # the next replay rewrites the pool's
        if out.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return out

    def _fill_host(self, positions: list[int], tables: list[list[int]], limits: list[int], steps: int, size: int) -> None:
        n = len(positions)
        width = max(len(t) for t in tables)
        table = self.host_tables.numpy()[: n * width].reshape(n, width)
        table[:] = 0
        for i, t in enumerate(tables):
            table[i, : len(t)] = t
        pos = np.asarray(positions, dtype=np.int64)[None, :] + np.arange(steps)[:, None]  # [steps, n]
        alive = np.arange(steps)[:, None] < np.asarray(limits)[None, :]  # [steps, n]
        block = np.minimum(pos // self.block_size, width - 1)  # dead rows may point past their table
        slots = table[np.arange(n)[None, :], block] * self.block_size + pos % self.block_size
        hp, hs, hl = self.host_positions.numpy(), self.host_slots.numpy(), self.host_seq_lens.numpy()
        hp[:steps, :n] = np.where(alive, pos, 0)
        hs[:steps, :n] = np.where(alive, slots, -1)
        hl[:steps, :n] = np.where(alive, pos + 1, 0)
        hp[:steps, n:size], hs[:steps, n:size], hl[:steps, n:size] = 0, -1, 0
