"""Rank 0's side of the step plan (folio/parallel/step_plan.py): what the model runner sends the
tensor-parallel followers each step, so they run the same forward and LM-head calls."""

from __future__ import annotations

import torch

from folio.core.scheduler_output import SchedulerOutput
from folio.parallel import step_plan
from folio.sample.transfer import to_device
from folio.worker.step_inputs import StepInputs


def send_step_plan(
    inputs: StepInputs, bucket: int | None, scheduler_output: SchedulerOutput, block_size: int, device: torch.device,
    chunk: tuple[int, int] | None = None,
) -> None:
    """Broadcast this step to the followers: its inputs, the graph rank 0 replays (a decode
    bucket, or a chunk graph's key) and every LM-head call to come."""
    md = inputs.attn_metadata
    width = step_plan.table_width(md.max_seq_len, block_size)
    step_plan.send_step(
        device,
        (inputs.input_ids, inputs.positions, md.slot_mapping, md.query_start_loc, md.seq_lens,
         md.block_tables[:, :width]),
        (inputs.num_tokens, md.num_seqs, md.max_query_len, md.max_seq_len, md.is_decode_only, bucket, chunk),
        logit_sets(inputs, device),
        block_moves(scheduler_output),
    )


def logit_sets(inputs: StepInputs, device: torch.device) -> list[torch.Tensor]:
    """The rows of each LM-head call launch_sampling makes, in order (each [n] int64)."""
    sets = []
    if inputs.sampling_batch_indices:
        rows = inputs.logits_indices
        sets.append(rows if rows is not None else torch.arange(inputs.num_tokens, device=device))
    return sets + [to_device(p.token_rows, torch.int64, device) for p in inputs.prompt_logprobs_plans]


def send_moves_only(scheduler_output: SchedulerOutput, device: torch.device) -> None:
    """A step with block moves and nothing to run: the followers move their blocks too."""
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    qsl = torch.zeros(1, dtype=torch.int64, device=device)
    step_plan.send_step(
        device, (empty, empty, empty, qsl, empty, empty.view(0, 0)), (0, 0, 0, 0, False, None, None), [],
        block_moves(scheduler_output),
    )


def send_stop(device: torch.device) -> None:
    """Tell the followers to leave their loops."""
    step_plan.send_stop(device)


def block_moves(so: SchedulerOutput) -> tuple:
    """The step's block copies, swap-outs and swap-ins, as the plan carries them."""
    return (tuple(so.blocks_to_copy), tuple(so.blocks_to_swap_out), tuple(so.blocks_to_swap_in))
