"""Follower: the loop of every rank but 0, repeating rank 0's steps from its StepPlans.

A follower owns a ModelRunner like rank 0's (its slice of the weights, its heads' KV cache, the
same CUDA graphs) but no scheduler and no sampler: it copies each plan into the runner's
persistent input buffers (the addresses its graphs read), moves blocks as told, runs the
forward, and joins each LM-head gather rank 0 makes. Its logits are dropped: rank 0 samples.
"""

from __future__ import annotations

import numpy as np
import torch

from folio.attention.metadata import AttentionMetadata, longest_first
from folio.logger import init_logger
from folio.parallel.step_plan import StepPlan, receive
from folio.worker import block_ops
from folio.worker.model_runner import ModelRunner

logger = init_logger(__name__)


class Follower:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.device = runner.device
        self._warned_chunk = False  # a chunk graph rank 0 named and this rank lacks, said once

    @torch.inference_mode()
    def run(self) -> None:
        """Repeat steps until rank 0 sends stop."""
        steps = 0
        while (plan := receive(self.device)) is not None:
            self.step(plan)
            steps += 1
        logger.info("Stopped after %d steps.", steps)

    def step(self, plan: StepPlan) -> None:
        runner = self.runner
        if plan.blocks_to_copy or plan.blocks_to_swap_out or plan.blocks_to_swap_in:
            assert runner.kv_cache is not None
            block_ops.apply_block_moves(runner.kv_cache, runner.swap_pool, plan)  # type: ignore[arg-type]
        if plan.input_ids.numel() == 0:
            return
        input_ids, positions, metadata = self._load_inputs(plan)
        graphs = runner.graphs
        chunk = plan.chunk if graphs is not None else None
        if chunk is not None and chunk not in graphs.chunk_graphs:
            self._warn_missing_chunk_graph(chunk)
            chunk = None  # the padded step runs eagerly: the same collectives
        if chunk is not None:
            hidden = graphs.replay_chunk(chunk)  # [chunk tokens + decode slots, hidden]
        elif plan.bucket is not None and graphs is not None:
            hidden = graphs.replay(plan.bucket)  # [bucket, hidden]
        else:
            hidden = runner.model(input_ids, positions, metadata)  # [padded_tokens, hidden]
        for rows in plan.logit_sets:
            runner.model.compute_logits(hidden[rows])  # joins rank 0's gather; dropped here

    def _warn_missing_chunk_graph(self, key: tuple[int, int]) -> None:
        """Rank 0 replays a chunk graph this rank did not capture (its FOLIO_CHUNK_GRAPH_* differ):
        the padded step runs eagerly here, the same collectives; said once."""
        if not self._warned_chunk:
            self._warned_chunk = True
            logger.warning("Rank 0 replays chunk graph %s, which this rank did not capture (set "
                           "FOLIO_CHUNK_GRAPH_TOKENS and FOLIO_CHUNK_GRAPH_DECODES alike on every rank); such "
                           "steps run eagerly here.", key)

    def _load_inputs(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Copy the plan into the runner's persistent buffers and describe them."""
        builder = self.runner.inputs
        d = builder.buffers.device
        tokens, seqs = plan.input_ids.shape[0], plan.padded_seqs
        for name, source in (
            ("input_ids", plan.input_ids),
            ("positions", plan.positions),
            ("slot_mapping", plan.slot_mapping),
            ("query_start_loc", plan.query_start_loc),
            ("seq_lens", plan.seq_lens),
        ):
            d[name][: source.shape[0]].copy_(source)
        width = plan.block_tables.shape[1]
        builder.device_block_tables[:seqs, :width].copy_(plan.block_tables)
        order = None
        if plan.is_decode_only:  # rank 0's program order, from the same lengths
            order = d["decode_order"][:seqs]
            order.copy_(torch.from_numpy(longest_first(np.asarray(plan.seq_lens_cpu, dtype=np.int64))))
        metadata = AttentionMetadata(
            num_actual_tokens=plan.num_tokens,
            num_seqs=seqs,
            max_query_len=plan.max_query_len,
            max_seq_len=plan.max_seq_len,
            query_start_loc=d["query_start_loc"][: seqs + 1],
            seq_lens=d["seq_lens"][:seqs],
            block_tables=builder.device_block_tables[:seqs],
            slot_mapping=d["slot_mapping"][:tokens],
            query_start_loc_cpu=plan.query_start_loc_cpu,
            seq_lens_cpu=plan.seq_lens_cpu,
            is_decode_only=plan.is_decode_only,
            decode_order=order,
        )
        return d["input_ids"][:tokens], d["positions"][:tokens], metadata
