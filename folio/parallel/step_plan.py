"""StepPlan: one step's inputs, sent by rank 0 to the other ranks as plain int tensors.

The scheduler runs on rank 0 only. Each step rank 0 broadcasts a fixed-length int64 header,
then one flat int64 body whose layout the header's sizes fix (no pickle, no sockets of our
own: two torch.distributed broadcasts, on the device under NCCL so async scheduling never waits):

  header: kind, num_tokens, padded_tokens, padded_seqs, table_width, max_query_len,
          max_seq_len, is_decode_only, bucket (-1: eager), num_logit_sets, num_copies,
          num_swap_outs, num_swap_ins, body_len, chunk tokens (-1: no chunk graph), chunk decode slots
  body:   input_ids[padded_tokens] positions[padded_tokens] slot_mapping[padded_tokens]
          query_start_loc[padded_seqs + 1] seq_lens[padded_seqs] block_tables[padded_seqs * width]
          logit_set_sizes[num_logit_sets] logit_rows[sum of sizes]
          copies[2 * n] swap_outs[2 * n] swap_ins[2 * n]   (src, dst pairs)

Input ids are sent after rank 0 gathered its placeholders (async scheduling), so the other
ranks never need sampled ids. Each logit set is one compute_logits call rank 0 will make on
those rows of the hidden states: the LM head gathers over the ranks, so every rank makes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from folio.parallel.collectives import broadcast as _broadcast
from folio.parallel.group import get_plan_group

HEADER_LEN = 16
STOP, STEP = 0, 1
Pairs = Sequence[tuple[int, int]]


@dataclass
class StepPlan:
    """What a follower needs to repeat rank 0's step (tensors on the follower's device)."""

    num_tokens: int
    padded_seqs: int
    max_query_len: int
    max_seq_len: int
    is_decode_only: bool
    bucket: int | None
    input_ids: torch.Tensor  # [padded_tokens] int64
    positions: torch.Tensor  # [padded_tokens] int64
    slot_mapping: torch.Tensor  # [padded_tokens] int64
    query_start_loc: torch.Tensor  # [padded_seqs + 1] int64
    seq_lens: torch.Tensor  # [padded_seqs] int64
    block_tables: torch.Tensor  # [padded_seqs, width] int64
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    logit_sets: list[torch.Tensor] = field(default_factory=list)  # each [n] int64 rows
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    chunk: tuple[int, int] | None = None  # the chunk graph rank 0 replays (worker/chunk_graphs.py), by its key


def send_stop(device: torch.device) -> None:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    broadcast(_to(header, device))


def send_step(
    device: torch.device,
    tensors: Sequence[torch.Tensor],  # input_ids, positions, slot_mapping, qsl, seq_lens, block_tables (device)
    sizes: Sequence,  # num_tokens, padded_seqs, max_query_len, max_seq_len, is_decode_only, bucket, chunk key
    logit_sets: Sequence[torch.Tensor],  # each [n] int64 on the device
    moves: tuple[Pairs, Pairs, Pairs],  # copies, swap-outs, swap-ins
) -> None:
    """Rank 0: broadcast one step's plan (queued on the device stream under NCCL)."""
    input_ids, positions, slots, qsl, seq_lens, tables = tensors
    num_tokens, padded_seqs, max_query_len, max_seq_len, decode_only, bucket, chunk = sizes
    width = tables.shape[1] if tables.dim() == 2 else 0
    host_tail = [len(s) for s in logit_sets]
    pair_tail = [v for pairs in moves for pair in pairs for v in pair]
    parts = [t.reshape(-1).to(torch.int64) for t in (input_ids, positions, slots, qsl, seq_lens, tables)]
    parts.insert(6, _to(torch.tensor(host_tail, dtype=torch.int64), device))
    parts.extend(s.to(torch.int64) for s in logit_sets)
    parts.append(_to(torch.tensor(pair_tail, dtype=torch.int64), device))
    body = torch.cat(parts)  # [body_len] int64
    header = [
        STEP, num_tokens, input_ids.shape[0], padded_seqs, width, max_query_len, max_seq_len,
        int(decode_only), -1 if bucket is None else bucket, len(logit_sets),
        *(len(pairs) for pairs in moves), body.shape[0], *((-1, 0) if chunk is None else chunk),
    ]
    broadcast(_to(torch.tensor(header, dtype=torch.int64), device))
    broadcast(body)


def receive(device: torch.device) -> StepPlan | None:
    """Followers: the next step's plan, or None when rank 0 stops."""
    header = broadcast(torch.empty(HEADER_LEN, dtype=torch.int64, device=device)).tolist()
    kind, num_tokens, padded_tokens, padded_seqs, width, max_q, max_s, decode_only, bucket = header[:9]
    num_sets, n_copy, n_out, n_in, body_len, chunk_tokens, chunk_decodes = header[9:16]
    if kind == STOP:
        return None
    body = broadcast(torch.empty(body_len, dtype=torch.int64, device=device))  # [body_len]
    lengths = [padded_tokens] * 3 + [padded_seqs + 1, padded_seqs, padded_seqs * width, num_sets]
    pieces = list(body[: sum(lengths)].split(lengths))
    host = body.cpu()  # one sync: the small vectors the host needs
    offset = sum(lengths)
    qsl_cpu = host[sum(lengths[:3]) : sum(lengths[:4])].tolist()
    set_sizes = host[offset - num_sets : offset].tolist()
    logit_sets = list(body[offset : offset + sum(set_sizes)].split(set_sizes)) if set_sizes else []
    pairs = host[offset + sum(set_sizes) :].view(-1, 2).tolist()
    return StepPlan(
        num_tokens=num_tokens,
        padded_seqs=padded_seqs,
        max_query_len=max_q,
        max_seq_len=max_s,
        is_decode_only=bool(decode_only),
        bucket=None if bucket < 0 else bucket,
        input_ids=pieces[0],
        positions=pieces[1],
        slot_mapping=pieces[2],
        query_start_loc=pieces[3],
        seq_lens=pieces[4],
        block_tables=pieces[5].view(padded_seqs, width),
        query_start_loc_cpu=qsl_cpu,
        seq_lens_cpu=host[sum(lengths[:4]) : sum(lengths[:5])].tolist(),
        logit_sets=logit_sets,
        blocks_to_copy=[tuple(p) for p in pairs[:n_copy]],
        blocks_to_swap_out=[tuple(p) for p in pairs[n_copy : n_copy + n_out]],
        blocks_to_swap_in=[tuple(p) for p in pairs[n_copy + n_out : n_copy + n_out + n_in]],
        chunk=None if chunk_tokens < 0 else (chunk_tokens, chunk_decodes),
    )


def broadcast(x: torch.Tensor) -> torch.Tensor:
    """Plans travel on their own group: a follower may wait on one as long as the engine idles."""
    return _broadcast(x, group=get_plan_group())


def table_width(max_seq_len: int, block_size: int) -> int:
    """Columns of the block table a step's kernels can read."""
    return max(math.ceil(max_seq_len / block_size), 1)


def _to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without making the host wait for queued work (pinned + non_blocking)."""
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
