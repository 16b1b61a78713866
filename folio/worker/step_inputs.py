"""StepInputs: the flat batch tensors of one step, built from a SchedulerOutput.

Everything is assembled on the host with numpy and moved to the device in one copy per tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from folio.attention.metadata import AttentionMetadata
from folio.core.scheduler_output import SchedulerOutput


@dataclass(frozen=True)
class PromptLogprobsPlan:
    """Rows of this step's hidden states that score prompt tokens for one request."""

    batch_index: int  # the request's index in SchedulerOutput.scheduled
    token_rows: list[int]  # rows of the flat batch whose logits predict...
    target_ids: list[int]  # ...these prompt tokens
    start: int  # prompt index of target_ids[0] (>= 1)


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling] int64, last row of each sampling request
    sampling_batch_indices: list[int]  # which scheduled requests sample, in logits order
    prompt_logprobs_plans: list[PromptLogprobsPlan]


def build_step_inputs(
    scheduler_output: SchedulerOutput,
    block_size: int,
    device: torch.device,
    prompt_logprobs_done: dict[str, int],
) -> StepInputs:
    """Flatten the scheduled requests into one batch.

    prompt_logprobs_done maps request id -> index of the next prompt token still to be scored
    (a request preempted and recomputed does not score the same prompt tokens twice).
    """
    scheduled = scheduler_output.scheduled
    num_tokens = scheduler_output.total_num_scheduled_tokens
    num_seqs = len(scheduled)
    input_ids = np.empty(num_tokens, dtype=np.int64)
    positions = np.empty(num_tokens, dtype=np.int64)
    slot_mapping = np.empty(num_tokens, dtype=np.int64)
    query_start_loc = [0] * (num_seqs + 1)
    seq_lens = [0] * num_seqs
    max_blocks = max((len(s.block_ids) for s in scheduled), default=1)
    block_tables = np.zeros((num_seqs, max(max_blocks, 1)), dtype=np.int32)
    logits_rows: list[int] = []
    sampling_batch_indices: list[int] = []
    plans: list[PromptLogprobsPlan] = []

    offset = 0
    for i, sched in enumerate(scheduled):
        start, end = sched.num_computed_tokens, sched.end
        n = end - start
        tokens = sched.request.all_token_ids
        blocks = sched.block_ids
        if n == 1:  # decode: skip numpy overhead for the common single-token case
            input_ids[offset] = tokens[start]
            positions[offset] = start
            slot_mapping[offset] = blocks[start // block_size] * block_size + start % block_size
        else:
            pos = np.arange(start, end, dtype=np.int64)
            input_ids[offset : offset + n] = tokens[start:end]
            positions[offset : offset + n] = pos
            table = np.asarray(blocks, dtype=np.int64)
            slot_mapping[offset : offset + n] = table[pos // block_size] * block_size + pos % block_size
        block_tables[i, : len(blocks)] = blocks
        query_start_loc[i + 1] = offset + n
        seq_lens[i] = end
        plan = _plan_prompt_logprobs(i, sched, offset, prompt_logprobs_done)
        if plan is not None:
            plans.append(plan)
        offset += n
        if sched.samples:
            logits_rows.append(offset - 1)
            sampling_batch_indices.append(i)

    metadata = AttentionMetadata(
        num_actual_tokens=num_tokens,
        num_seqs=num_seqs,
        max_query_len=max((query_start_loc[i + 1] - query_start_loc[i] for i in range(num_seqs)), default=0),
        max_seq_len=max(seq_lens, default=0),
        query_start_loc=_to_device(np.asarray(query_start_loc, dtype=np.int32), device),
        seq_lens=_to_device(np.asarray(seq_lens, dtype=np.int32), device),
        block_tables=_to_device(block_tables, device),
        slot_mapping=_to_device(slot_mapping, device),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
        is_decode_only=num_tokens == num_seqs,
    )
    return StepInputs(
        input_ids=_to_device(input_ids, device),
        positions=_to_device(positions, device),
        attn_metadata=metadata,
        logits_indices=_to_device(np.asarray(logits_rows, dtype=np.int64), device),
        sampling_batch_indices=sampling_batch_indices,
        prompt_logprobs_plans=plans,
    )


def _plan_prompt_logprobs(
    batch_index: int, sched, row_offset: int, done: dict[str, int]
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


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor
