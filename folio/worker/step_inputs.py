"""StepInputs: the flat batch tensors of one step, built from a SchedulerOutput.

StepInputBuilder fills persistent buffers sized for the largest step: host arrays (pinned on a
GPU) written by numpy, then one host-to-device copy per tensor into persistent device tensors,
so a CUDA graph can read the same addresses every step. The only per-request Python left is
reading each request's few scalars and its new token ids; positions, slot mapping, sequence
lengths and the block table are computed with whole-batch numpy operations.

Padding (pad_to > num_seqs, for a captured graph's batch size): padded tokens have input id 0,
position 0 and slot -1 (nothing written to the cache); padded sequences have query length 0 and
seq_len 0, so attention skips them. Their rows of the output are garbage and never read.
A chunk graph's step (pad_tokens_to) pads tokens past its sequences' (and, beside decodes,
sequences as above): the padded tokens belong to no sequence, so the attention's programs for
them find no query rows and exit.

Per-token sequences (per_token_seqs=True, speculative verify steps): every token of the step
becomes a sequence of its own in the attention metadata, with one query token at its position,
seq_len = position + 1 and its request's block-table row. Attention then computes exactly what
the causal mask of the request's multi-token query would (all of the step's K/V is written
before any attention of the layer reads it), but the batch is decode-only, so a verify step of
b requests x (1 + k) tokens replays the decode CUDA graph of b x (1 + k) sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from folio.attention.metadata import AttentionMetadata, longest_first
from folio.core.pending_drafts import PendingDrafts
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
from folio.worker.block_table import BlockTable


@dataclass(frozen=True)
class PromptLogprobsPlan:
    """Rows of this step's hidden states that score prompt tokens for one request."""

    batch_index: int  # the request's index in SchedulerOutput.scheduled
    token_rows: list[int]  # rows of the flat batch whose logits predict...
    target_ids: list[int]  # ...these prompt tokens
    start: int  # prompt index of target_ids[0] (>= 1)


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens (padded)] int64
    positions: torch.Tensor  # [num_tokens (padded)] int64
    attn_metadata: AttentionMetadata
    # [num_sampling] int64, last row of each sampling request; None when every token samples
    # (then the rows are 0 ... num_tokens - 1, e.g. a decode step)
    logits_indices: torch.Tensor | None
    sampling_batch_indices: list[int]  # which scheduled requests sample, in logits order
    prompt_logprobs_plans: list[PromptLogprobsPlan]
    num_tokens: int  # real tokens (input_ids may be padded past this)
    # Speculative decoding: requests that carry drafts, and the rows of all their scored
    # positions (last known token + drafts), in batch order; not in sampling_batch_indices.
    verify_batch_indices: list[int]
    verify_rows: list[int]
    # Async scheduling: tokens whose id the previous step samples on the device (input_ids
    # holds 0 there until the runner gathers them): their rows, and their requests' batch indices.
    placeholder_rows: list[int]
    placeholder_batch_indices: list[int]
    # Speculative decoding: drafts still on the device (core/pending_drafts.py), each with the
    # row of its first token; input_ids holds 0 there until fill_pending_drafts writes them.
    pending_drafts: list[tuple[int, PendingDrafts]] = field(default_factory=list)


class _Buffers:
    """One set of same-named host and device tensors (host pinned on CUDA)."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> None:
        pin = device.type == "cuda"
        self.host = {k: torch.zeros(s, dtype=d, pin_memory=pin) for k, (s, d) in shapes.items()}
        self.np = {k: t.numpy() for k, t in self.host.items()}
        self.device = {k: torch.zeros(s, dtype=d, device=device) for k, (s, d) in shapes.items()}


class StepInputBuilder:
    def __init__(
        self,
        max_num_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        max_blocks = -(-max_model_len // block_size)
        # Rows outlive a step by one (finished ids arrive with the next SchedulerOutput): 2x.
        self.block_table = BlockTable(2 * max_num_seqs, max_blocks)
        t, s = max_num_tokens, max_num_seqs
        self.buffers = _Buffers(
            {
                "input_ids": ((t,), torch.int64),
                "positions": ((t,), torch.int64),
                "slot_mapping": ((t,), torch.int64),
                "query_start_loc": ((s + 1,), torch.int32),
                "seq_lens": ((s,), torch.int32),
                "decode_order": ((s,), torch.int32),  # decode-only steps (AttentionMetadata.decode_order)
                # Flat on the host (a step's [num_seqs, width] table is a contiguous prefix),
                # [max_num_seqs, max_blocks] on the device (kernels take the row stride).
                "block_tables": ((s * max_blocks,), torch.int32),
            },
            device,
        )
        self.device_block_tables = self.buffers.device["block_tables"].view(s, max_blocks)
        # Host buffers are rewritten each step: wait until last step's copies have left them.
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    # ---- request lifetimes ------------------------------------------------------------------
    def forget(self, request_ids: frozenset[str] | tuple[str, ...]) -> None:
        for request_id in request_ids:
            self.block_table.drop(request_id)

    # ---- one step ---------------------------------------------------------------------------
    def build(
        self,
        scheduler_output: SchedulerOutput,
        prompt_logprobs_done: dict[str, int],
        pad_to: int | None = None,
        per_token_seqs: bool = False,
        pad_tokens_to: int | None = None,
    ) -> StepInputs:
        """Flatten the scheduled requests into one batch, padded to pad_to sequences (decode
        steps, or any step with per_token_seqs: one token per sequence), or to pad_tokens_to
        tokens with no sequence added (a chunk graph's step: the padded tokens belong to none).

        prompt_logprobs_done maps request id -> index of the next prompt token still to be
        scored (a request preempted and recomputed does not score the same prompt tokens twice).
        """
        scheduled = scheduler_output.scheduled
        num_tokens = scheduler_output.total_num_scheduled_tokens
        num_seqs = len(scheduled)
        if num_tokens > self.max_num_tokens or num_seqs > self.max_num_seqs:
            raise ValueError(
                f"Step of {num_tokens} tokens / {num_seqs} sequences exceeds the runner's buffers "
                f"({self.max_num_tokens} / {self.max_num_seqs})."
            )
        attn_seqs = num_tokens if per_token_seqs else num_seqs  # sequences the attention sees
        if attn_seqs > self.max_num_seqs:
            raise ValueError(f"A per-token-sequence step of {num_tokens} tokens exceeds {self.max_num_seqs} sequences.")
        padded_seqs = max(pad_to or attn_seqs, attn_seqs)
        padded_tokens = max(num_tokens + (padded_seqs - attn_seqs), pad_tokens_to or 0)
        if padded_tokens > self.max_num_tokens or padded_seqs > self.max_num_seqs:
            raise ValueError(f"Padding to {padded_seqs} sequences exceeds the runner's buffers "
                             f"({self.max_num_tokens} tokens / {self.max_num_seqs} sequences).")
        if self._copied is not None:
            self._copied.synchronize()
        self.block_table.begin_step()
        h = self.buffers.np
        rows, starts, counts, logits_rows, sampling, plans, placeholders, verify = self._fill_token_ids(
            scheduled, h["input_ids"], prompt_logprobs_done
        )
        seq_lens = starts + counts  # [num_seqs]
        positions = h["positions"][:num_tokens]
        if num_tokens == num_seqs:  # decode-only: one token per sequence at its last position
            positions[:] = starts
            token_rows = rows
        else:
            token_rows = np.repeat(rows, counts)  # [num_tokens]
            first_rows = np.cumsum(counts) - counts  # [num_seqs] each request's first token row
            positions[:] = np.arange(num_tokens) - np.repeat(first_rows - starts, counts)
        if per_token_seqs:  # each token its own sequence: query length 1, context up to itself
            attn_counts, attn_seq_lens, attn_rows = np.ones(num_tokens, np.int64), positions + 1, token_rows
        else:
            attn_counts, attn_seq_lens, attn_rows = counts, seq_lens, rows
        qsl = h["query_start_loc"]
        qsl[0] = 0
        np.cumsum(attn_counts, out=qsl[1 : attn_seqs + 1])
        qsl[attn_seqs + 1 : padded_seqs + 1] = num_tokens  # padded sequences: query length 0
        h["seq_lens"][:attn_seqs] = attn_seq_lens
        h["seq_lens"][attn_seqs:padded_seqs] = 0
        width = max(int(-(-seq_lens.max() // self.block_size)), 1) if num_seqs else 1
        table = self.block_table.table
        block_ids = table[token_rows, positions // self.block_size]  # [num_tokens]
        h["slot_mapping"][:num_tokens] = block_ids * self.block_size + positions % self.block_size
        for name, fill in (("input_ids", 0), ("positions", 0), ("slot_mapping", -1)):
            h[name][num_tokens:padded_tokens] = fill
        step_table = self.block_table.gather(attn_rows, width, h["block_tables"])  # [attn_seqs, width]
        decode_only = num_tokens == attn_seqs
        if decode_only:
            h["decode_order"][:padded_seqs] = longest_first(h["seq_lens"][:padded_seqs])
        self._copy_to_device(padded_tokens, padded_seqs, step_table, decode_only)
        metadata = self._metadata(num_tokens, padded_tokens, padded_seqs, int(attn_counts.max()) if num_seqs else 0,
                                  int(seq_lens.max()) if num_seqs else 0, decode_only)
        d = self.buffers.device
        return StepInputs(
            input_ids=d["input_ids"][:padded_tokens],
            positions=d["positions"][:padded_tokens],
            attn_metadata=metadata,
            logits_indices=None if len(logits_rows) == num_tokens else _move(logits_rows, self.device),
            sampling_batch_indices=sampling,
            prompt_logprobs_plans=plans,
            num_tokens=num_tokens,
            verify_batch_indices=verify[1],
            verify_rows=verify[0],
            placeholder_rows=placeholders[0],
            placeholder_batch_indices=placeholders[1],
            pending_drafts=self._pending_drafts,
        )

    def chunk_capture_inputs(self, num_tokens: int, num_decodes: int = 0) -> StepInputs:
        """What a chunk graph is captured with (worker/chunk_graphs.py): one sequence of
        num_tokens new tokens and no context, then num_decodes sequences of one token, so the
        backends pick the kernels such a step gets; it writes nothing (slots -1) and reads block
        0. A replay's build(pad_to=1 + num_decodes, pad_tokens_to=num_tokens + num_decodes)
        rewrites the same buffers with the real step."""
        width, seqs, total = -(-num_tokens // self.block_size), 1 + num_decodes, num_tokens + num_decodes
        if total > self.max_num_tokens or seqs > self.max_num_seqs or width > self.device_block_tables.shape[1]:
            raise ValueError(f"A chunk graph of {num_tokens} tokens and {num_decodes} decodes exceeds the runner's "
                             f"{self.max_num_tokens} tokens, {self.max_num_seqs} sequences or "
                             f"{self.device_block_tables.shape[1]} blocks a sequence.")
        if self._copied is not None:
            self._copied.synchronize()
        h = self.buffers.np
        h["input_ids"][:total] = 0
        h["positions"][:num_tokens] = np.arange(num_tokens)
        h["positions"][num_tokens:total] = 0
        h["slot_mapping"][:total] = -1
        h["query_start_loc"][0] = 0
        h["query_start_loc"][1 : seqs + 1] = num_tokens + np.arange(seqs)
        h["seq_lens"][0] = num_tokens
        h["seq_lens"][1:seqs] = 1
        table = np.zeros((seqs, width), np.int32)
        h["block_tables"][: seqs * width] = 0
        self._copy_to_device(total, seqs, table, False)
        d = self.buffers.device
        return StepInputs(
            input_ids=d["input_ids"][:total], positions=d["positions"][:total],
            attn_metadata=self._metadata(total, total, seqs, num_tokens, num_tokens, False),
            logits_indices=None, sampling_batch_indices=[], prompt_logprobs_plans=[], num_tokens=total,
            verify_batch_indices=[], verify_rows=[], placeholder_rows=[], placeholder_batch_indices=[],
        )

    def _metadata(self, num_tokens: int, padded_tokens: int, padded_seqs: int, max_query_len: int, max_seq_len: int,
                  decode_only: bool) -> AttentionMetadata:
        """The attention's view of the device buffers this step's build just filled."""
        h, d = self.buffers.np, self.buffers.device
        return AttentionMetadata(
            num_actual_tokens=num_tokens,
            num_seqs=padded_seqs,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            query_start_loc=d["query_start_loc"][: padded_seqs + 1],
            seq_lens=d["seq_lens"][:padded_seqs],
            block_tables=self.device_block_tables[:padded_seqs],
            slot_mapping=d["slot_mapping"][:padded_tokens],
            query_start_loc_cpu=h["query_start_loc"][: padded_seqs + 1].tolist(),
            seq_lens_cpu=h["seq_lens"][:padded_seqs].tolist(),
            is_decode_only=decode_only,
            decode_order=d["decode_order"][:padded_seqs] if decode_only else None,
        )

    def _fill_token_ids(
        self,
        scheduled: list[ScheduledRequest],
        input_ids: np.ndarray,
        prompt_logprobs_done: dict[str, int],
    ) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, list[int], list[int], list[PromptLogprobsPlan],
        tuple[list[int], list[int]], tuple[list[int], list[int]],
    ]:
        """The per-request loop: block-table rows, new token ids, who samples, whose new
        token is a placeholder (the only new token then; see ScheduledRequest), and who
        verifies drafts (all of its rows are scored)."""
        rows, starts, counts, ids = [], [], [], []
        self._pending_drafts: list[tuple[int, PendingDrafts]] = []
        logits_rows: list[int] = []
        sampling: list[int] = []
        plans: list[PromptLogprobsPlan] = []
        placeholders: tuple[list[int], list[int]] = ([], [])  # (token rows, batch indices)
        verify: tuple[list[int], list[int]] = ([], [])  # (scored rows, batch indices)
        row_for = self.block_table.row_for
        offset = 0
        # Plain Python lists inside the loop (a numpy scalar write costs ~10x a list append).
        for i, sched in enumerate(scheduled):
            request = sched.request
            start, n = sched.num_computed_tokens, sched.num_new_tokens
            rows.append(row_for(request.request_id, sched.block_ids))
            starts.append(start)
            counts.append(n)
            tokens = request.all_token_ids
            if n == 1:
                if start < len(tokens):
                    ids.append(tokens[start])
                else:  # sampled by the step in flight: the runner fills it in on the device
                    ids.append(0)
                    placeholders[0].append(offset)
                    placeholders[1].append(i)
            else:
                drafts = sched.spec_token_ids
                known = n - len(drafts)
                if start + known > len(tokens):
                    raise ValueError(f"{request.request_id}: a placeholder in a {n}-token chunk.")
                ids.extend(tokens[start : start + known])
                if isinstance(drafts, PendingDrafts):  # values on the device: filled there
                    ids.extend([0] * len(drafts))
                    self._pending_drafts.append((offset + known, drafts))
                elif drafts:
                    ids.extend(drafts)
                if drafts:
                    verify[0].extend(range(offset + known - 1, offset + n))
                    verify[1].append(i)
            if request.sampling_params.prompt_logprobs is not None:
                plan = _plan_prompt_logprobs(i, sched, offset, prompt_logprobs_done)
                if plan is not None:
                    plans.append(plan)
            offset += n
            if sched.samples and not sched.spec_token_ids:
                logits_rows.append(offset - 1)
                sampling.append(i)
        input_ids[:offset] = ids
        as_array = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        return as_array(rows), as_array(starts), as_array(counts), logits_rows, sampling, plans, placeholders, verify

    def _copy_to_device(self, padded_tokens: int, padded_seqs: int, step_table: np.ndarray, decode_only: bool) -> None:
        """Copy this step's prefixes of the host buffers into the device buffers (async)."""
        hb, d = self.buffers.host, self.buffers.device
        for name, n in (
            ("input_ids", padded_tokens),
            ("positions", padded_tokens),
            ("slot_mapping", padded_tokens),
            ("query_start_loc", padded_seqs + 1),
            ("seq_lens", padded_seqs),
            ("decode_order", padded_seqs if decode_only else 0),
        ):
            if n:
                d[name][:n].copy_(hb[name][:n], non_blocking=True)
        rows, width = step_table.shape
        host_table = hb["block_tables"][: rows * width].view(rows, width)
        self.device_block_tables[:rows, :width].copy_(host_table, non_blocking=True)
        if self._copied is not None:
            self._copied.record()


def _plan_prompt_logprobs(
    batch_index: int, sched: ScheduledRequest, row_offset: int, done: dict[str, int]
) -> PromptLogprobsPlan | None:
    """Which rows of this chunk score prompt tokens not yet scored.

    The logits at position p predict token p + 1, so a chunk covering positions [start, end)
    scores prompt tokens max(start, 0) + 1 ... min(end, num_prompt) - 1 + 1.
    """
    request = sched.request
    if request.sampling_params.prompt_logprobs is None:
        return None
    num_prompt = request.num_prompt_tokens
    first_target = max(sched.num_computed_tokens + 1, done.get(request.request_id, 1))
    last_target = min(sched.end, num_prompt - 1)  # inclusive
    if first_target > last_target:
        return None
    rows = [row_offset + (t - 1 - sched.num_computed_tokens) for t in range(first_target, last_target + 1)]
    targets = request.prompt_token_ids[first_target : last_target + 1]
    return PromptLogprobsPlan(batch_index, rows, list(targets), first_target)


def _move(values: list[int], device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(values, dtype=np.int64))
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor
