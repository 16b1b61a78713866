"""StepInputBuilder: the flat batch equals a per-token construction, step after step, with
padding that attention skips (checked through the Triton kernels on the CPU interpreter)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.attention.backends.triton_backend import TritonAttentionBackend
from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
from folio.sampling_params import SamplingParams
from folio.worker.cuda_graphs import decode_graph_sizes, graph_batch_sizes
from folio.worker.step_inputs import StepInputBuilder

BLOCK = 4


class _Seq:
    """A request with a shuffled block list that grows as its tokens do."""

    def __init__(self, name: str, num_prompt: int, free: list[int], rng: random.Random) -> None:
        self.request = Request(name, [rng.randrange(1000) for _ in range(num_prompt)], SamplingParams(max_tokens=50))
        self.blocks: list[int] = []
        self.free = free

    def schedule(self, num_new: int) -> ScheduledRequest:
        start = self.request.num_computed_tokens
        while len(self.blocks) * BLOCK < start + num_new:
            self.blocks.append(self.free.pop())
        self.request.num_computed_tokens += num_new
        samples = start + num_new >= self.request.num_tokens
        return ScheduledRequest(self.request, start, num_new, self.blocks, samples)


def _expected(scheduled: list[ScheduledRequest]) -> dict[str, list]:
    ids, pos, slots, qsl, lens = [], [], [], [0], []
    for s in scheduled:
        for p in range(s.num_computed_tokens, s.end):
            ids.append(s.request.all_token_ids[p])
            pos.append(p)
            slots.append(s.block_ids[p // BLOCK] * BLOCK + p % BLOCK)
        qsl.append(qsl[-1] + s.num_new_tokens)
        lens.append(s.end)
    return dict(input_ids=ids, positions=pos, slot_mapping=slots, query_start_loc=qsl, seq_lens=lens)


def _check(builder: StepInputBuilder, scheduled: list[ScheduledRequest], pad_to: int | None = None):
    out = SchedulerOutput(scheduled, sum(s.num_new_tokens for s in scheduled))
    inputs = builder.build(out, {}, pad_to=pad_to)
    want = _expected(scheduled)
    n, md = len(want["input_ids"]), inputs.attn_metadata
    assert inputs.input_ids[:n].tolist() == want["input_ids"]
    assert inputs.positions[:n].tolist() == want["positions"]
    assert md.slot_mapping[:n].tolist() == want["slot_mapping"]
    assert md.query_start_loc[: len(scheduled) + 1].tolist() == want["query_start_loc"]
    assert md.seq_lens[: len(scheduled)].tolist() == want["seq_lens"]
    assert md.query_start_loc_cpu[: len(scheduled) + 1] == want["query_start_loc"]
    for i, s in enumerate(scheduled):
        assert md.block_tables[i, : len(s.block_ids)].tolist() == s.block_ids
    _check_decode_order(md)
    return inputs


def _check_decode_order(md) -> None:
    """A decode-only step orders every (padded) sequence from the longest context down."""
    if not md.is_decode_only:
        assert md.decode_order is None
        return
    lens, order = md.seq_lens.tolist(), md.decode_order.tolist()
    assert sorted(order) == list(range(md.num_seqs))
    assert [lens[i] for i in order] == sorted(lens, reverse=True)


def test_steps_match_a_per_token_construction():
    rng = random.Random(0)
    free = list(range(200))
    rng.shuffle(free)
    builder = StepInputBuilder(64, 8, 128, BLOCK, torch.device("cpu"))
    seqs = [_Seq(f"r{i}", n, free, rng) for i, n in enumerate([9, 1, 17])]
    # Step 1: two prefill chunks and a whole one-token prompt; only complete prompts sample.
    inputs = _check(builder, [seqs[0].schedule(5), seqs[1].schedule(1), seqs[2].schedule(17)])
    assert inputs.sampling_batch_indices == [1, 2] and inputs.logits_indices.tolist() == [5, 22]
    for s in seqs[1:]:
        s.request.append_output_token_ids([rng.randrange(1000)])
    # Step 2: a chunk finishing the first prompt, mixed with decodes that cross block boundaries.
    _check(builder, [seqs[2].schedule(1), seqs[0].schedule(4), seqs[1].schedule(1)])
    seqs[0].request.append_output_token_ids([3])
    # Step 3, decode-only, reordered, with copy-on-write of one request's last block.
    seqs[2].blocks[-1] = free.pop()
    for s in seqs[1:]:
        s.request.append_output_token_ids([rng.randrange(1000)])
    inputs = _check(builder, [seqs[1].schedule(1), seqs[2].schedule(1), seqs[0].schedule(1)])
    assert inputs.attn_metadata.is_decode_only and inputs.logits_indices is None
    # A preempted request comes back with new blocks and recomputes from 0.
    builder.forget(("r2",))
    seqs[2].request.num_computed_tokens, seqs[2].blocks[:] = 0, []
    _check(builder, [seqs[2].schedule(10)])


def _cached_contexts(rng: random.Random) -> list[_Seq]:
    """Three requests of 6, 13 and 3 tokens whose context but the last token is cached."""
    free = list(range(100))
    rng.shuffle(free)
    seqs = [_Seq(f"r{i}", n, free, rng) for i, n in enumerate([6, 13, 3])]
    for s in seqs:
        s.schedule(s.request.num_tokens - 1)
    return seqs


def test_padding_is_skipped_by_attention():
    """A decode batch padded to a graph size: padded slots are -1, padded sequences have query
    length 0 and seq_len 0, and the Triton decode kernel gives the unpadded batch's output."""
    rng = random.Random(1)
    builder = StepInputBuilder(64, 8, 64, BLOCK, torch.device("cpu"))
    batch = [s.schedule(1) for s in _cached_contexts(rng)]
    inputs = _check(builder, batch, pad_to=8)
    md = inputs.attn_metadata
    assert md.num_seqs == 8 and inputs.input_ids.shape[0] == 8 and md.num_actual_tokens == 3
    assert md.slot_mapping[3:].tolist() == [-1] * 5
    assert md.query_start_loc[3:].tolist() == [3] * 6 and md.seq_lens[3:].tolist() == [0] * 5
    assert md.decode_order.tolist() == [1, 0, 2, 3, 4, 5, 6, 7]  # 13, 6, 3 tokens, then the padding

    heads, kv_heads, dim = 4, 2, 16
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, 100, BLOCK, kv_heads, dim, generator=gen)
    query = torch.randn(8, heads, dim, generator=gen)
    want = TorchAttentionBackend().forward(query, kv_cache, md, 0.25)
    got = TritonAttentionBackend(num_splits=2).forward(query, kv_cache, md, 0.25)
    torch.testing.assert_close(got[:3], want[:3], atol=1e-5, rtol=1e-5)


def test_oversized_step_is_refused():
    builder = StepInputBuilder(4, 2, 64, BLOCK, torch.device("cpu"))
    rng = random.Random(2)
    seq = _Seq("a", 9, list(range(10)), rng)
    with pytest.raises(ValueError, match="exceeds"):
        builder.build(SchedulerOutput([seq.schedule(9)], 9), {})


@pytest.mark.parametrize(
    ("max_num_seqs", "sizes"),
    [(1, [1]), (5, [1, 2, 4, 5]), (20, [1, 2, 4, 8, 16, 20]), (256, [1, 2, 4] + list(range(8, 257, 8)))],
)
def test_graph_batch_sizes(max_num_seqs, sizes):
    assert graph_batch_sizes(max_num_seqs) == sizes


def test_verify_steps_as_per_token_sequences_give_the_same_attention():
    """A speculative verify step (requests with 1 + k query tokens) built with per_token_seqs:
    every token its own decode sequence (seq_len = position + 1, its request's block row), padded
    to a graph size. The same tokens, positions and slots; the decode kernel's attention over it
    equals the reference's causal attention over the multi-token queries."""
    rng = random.Random(3)
    builder = StepInputBuilder(64, 16, 64, BLOCK, torch.device("cpu"))
    seqs = _cached_contexts(rng)
    batch = []
    for s, k in zip(seqs, [3, 1, 4]):  # drafts of several lengths, crossing block boundaries
        s.request.append_output_token_ids([rng.randrange(1000)])  # the token the drafts follow
        drafts = tuple(rng.randrange(1000) for _ in range(k))
        batch.append(dataclasses.replace(s.schedule(1 + k), spec_token_ids=drafts))
    out = SchedulerOutput(batch, sum(s.num_new_tokens for s in batch))
    plain = builder.build(out, {})
    positions = [p for s in batch for p in range(s.num_computed_tokens, s.end)]
    want = {"positions": positions,
            "slot_mapping": [s.block_ids[p // BLOCK] * BLOCK + p % BLOCK for s in batch for p in range(s.num_computed_tokens, s.end)],
            "input_ids": [t for s in batch for t in (s.request.all_token_ids[s.num_computed_tokens], *s.spec_token_ids)]}
    n = len(positions)
    assert plain.input_ids[:n].tolist() == want["input_ids"]
    plain_md = plain.attn_metadata
    plain_positions, plain_slots = plain.positions.clone(), plain_md.slot_mapping.clone()
    plain_md = type(plain_md)(**{**vars(plain_md), "query_start_loc": plain_md.query_start_loc.clone(),
                                 "seq_lens": plain_md.seq_lens.clone(), "block_tables": plain_md.block_tables.clone()})
    inputs = builder.build(out, {}, pad_to=16, per_token_seqs=True)
    md = inputs.attn_metadata
    assert inputs.input_ids[:n].tolist() == want["input_ids"]
    assert inputs.positions[:n].tolist() == plain_positions[:n].tolist() == want["positions"]
    assert md.slot_mapping[:n].tolist() == plain_slots[:n].tolist() == want["slot_mapping"]
    assert md.is_decode_only and md.num_seqs == 16 and md.max_query_len == 1 and n == 11
    _check_decode_order(md)
    assert md.query_start_loc[: n + 1].tolist() == list(range(n + 1)) and md.query_start_loc[n + 1 :].tolist() == [n] * 5
    assert md.seq_lens[:n].tolist() == [p + 1 for p in want["positions"]] and md.seq_lens[n:].tolist() == [0] * 5
    assert md.slot_mapping[n:].tolist() == [-1] * 5
    owners = [i for i, s in enumerate(batch) for _ in range(s.num_new_tokens)]
    for t, i in enumerate(owners):
        assert md.block_tables[t, : len(batch[i].block_ids)].tolist() == batch[i].block_ids
    assert inputs.verify_rows == plain.verify_rows and inputs.verify_batch_indices == [0, 1, 2]

    heads, kv_heads, dim = 4, 2, 16
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, 100, BLOCK, kv_heads, dim, generator=gen)
    query = torch.randn(16, heads, dim, generator=gen)
    want_out = TorchAttentionBackend().forward(query[:n], kv_cache, plain_md, 0.25)
    torch.testing.assert_close(TorchAttentionBackend().forward(query, kv_cache, md, 0.25)[:n], want_out, atol=1e-5, rtol=1e-5)
    got = TritonAttentionBackend(num_splits=2).forward(query, kv_cache, md, 0.25)
    torch.testing.assert_close(got[:n], want_out, atol=1e-5, rtol=1e-5)


def test_padding_past_the_token_buffer_is_refused_and_graph_sizes_respect_it():
    """A graph of n sequences feeds n tokens: with max_num_batched_tokens below max_num_seqs,
    padding to more than the token buffer is an error (it used to be cut silently), and the
    runner captures no graph larger than the token budget."""
    builder = StepInputBuilder(4, 8, 64, BLOCK, torch.device("cpu"))
    with pytest.raises(ValueError, match="Padding to 8 sequences exceeds"):
        builder.build(SchedulerOutput([], 0), {}, pad_to=8)
    assert builder.build(SchedulerOutput([], 0), {}, pad_to=4).input_ids.shape[0] == 4
    assert decode_graph_sizes(8, 4) == [1, 2, 4] and decode_graph_sizes(16, 8192) == [1, 2, 4, 8, 16]
