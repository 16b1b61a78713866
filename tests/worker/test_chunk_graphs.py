"""Chunk graphs (worker/chunk_graphs.py): which keys a model gets, which steps replay one, that a
chunk (alone or beside decodes) padded to a graph's shape attends as the plain step on its real
rows, that the capture and the replays share the buffers the graph reads, and that the engine's
tokens and log-probs do not change when such steps run padded (forced on the CPU, where there are
no graphs)."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.attention.backends.triton_backend import TritonAttentionBackend
from folio.worker.chunk_graphs import (chunk_graph_bytes, chunk_graph_cap, chunk_graph_keys, chunk_graph_sizes,
                                       chunk_step_shape,
                                       linear_params_per_token)
from folio.worker.step_inputs import StepInputBuilder
from tests.worker.test_per_token_steps import _step
from tests.worker.test_step_inputs import BLOCK


def _model(layers: int, hidden: int, heads: int, kv_heads: int, inter: int, head_dim: int = 128) -> SimpleNamespace:
    return SimpleNamespace(hf_config={"intermediate_size": inter}, hidden_size=hidden, num_attention_heads=heads,
                           head_dim=head_dim, num_kv_heads=kv_heads, num_layers=layers)


QWEN3_06B = _model(28, 1024, 16, 8, 3072)
LLAMA_8B = _model(32, 4096, 32, 8, 14336)


def test_linear_weights_of_the_real_shapes():
    assert linear_params_per_token(QWEN3_06B) == 440_401_920
    assert linear_params_per_token(LLAMA_8B) == 6_979_321_856
    assert linear_params_per_token(LLAMA_8B, tp_size=2) == 6_979_321_856 // 2


def test_the_cap_follows_the_work_per_token(monkeypatch):
    """The 0.6B's launches hide more of its GPU work than the 8B's: 4,096 (the most) vs 1,031
    tokens, on the grid 1,024; two ranks halve the work a token, so the 8B's cap doubles; the
    longest schedulable chunk and FOLIO_CHUNK_GRAPH_TOKENS bound it, and it is always a size."""
    monkeypatch.delenv("FOLIO_CHUNK_GRAPH_TOKENS", raising=False)
    assert chunk_graph_cap(QWEN3_06B, 16384) == 4096
    assert chunk_graph_cap(QWEN3_06B, 4001) == 4001  # max_model_len 4001: its longest prompt too
    assert chunk_graph_cap(LLAMA_8B, 16384) == 1024
    assert chunk_graph_cap(LLAMA_8B, 16384, tp_size=2) == 2048
    assert chunk_graph_cap(LLAMA_8B, 700) == 700
    assert chunk_graph_sizes(1024) == [16, 32, 64, 128, 256, 512, 768, 1024]
    assert chunk_graph_sizes(4096)[-3:] == [3584, 3840, 4096] and len(chunk_graph_sizes(4096)) == 20
    assert chunk_graph_sizes(4001)[-3:] == [3584, 3840, 4001]
    assert chunk_graph_sizes(100) == [16, 32, 64, 100] and chunk_graph_sizes(16) == [16]
    assert chunk_graph_sizes(1) == chunk_graph_sizes(0) == []
    monkeypatch.setenv("FOLIO_CHUNK_GRAPH_TOKENS", "0")
    assert chunk_graph_sizes(chunk_graph_cap(QWEN3_06B, 16384)) == []
    monkeypatch.setenv("FOLIO_CHUNK_GRAPH_TOKENS", "1024")
    assert chunk_graph_cap(LLAMA_8B, 16384) == 1024 and chunk_graph_cap(LLAMA_8B, 512) == 512
    monkeypatch.setenv("FOLIO_CHUNK_GRAPH_TOKENS", "lots")
    with pytest.raises(ValueError, match="FOLIO_CHUNK_GRAPH_TOKENS"):
        chunk_graph_cap(LLAMA_8B, 16384)


def test_the_pool_estimate_of_the_chunk_graphs():
    """The 0.6B's 44 graphs at bf16: the live activations of a 4,351-token layer and every
    graph's output, ~0.3 GB (its pool grew 0.16 GiB for the first 20 graphs, session 24)."""
    keys = chunk_graph_keys(4096, 256, 16384, with_decodes=True)
    assert len(keys) == 44
    assert 0.25e9 < chunk_graph_bytes(QWEN3_06B, keys, 2) < 0.34e9
    assert chunk_graph_bytes(QWEN3_06B, [], 2) == 0
    assert chunk_graph_bytes(LLAMA_8B, keys, 2, tp_size=2) < chunk_graph_bytes(LLAMA_8B, keys, 2)


def test_the_keys_add_decode_slots_to_coarser_chunks():
    """Alone: every size; beside decodes: MIXED_TOKENS below the cap and the cap, times the slots
    (never more than max_num_seqs - 1), none past the step's token buffers."""
    keys = chunk_graph_keys(1024, 256, 16384, with_decodes=True)
    assert [k for k in keys if k[1] == 0] == [(s, 0) for s in chunk_graph_sizes(1024)]
    assert sorted(k for k in keys if k[1]) == [(t, d) for t in (64, 256, 512, 1024) for d in (7, 16, 64, 255)]
    assert sorted({d for _, d in chunk_graph_keys(700, 8, 16384, True)}) == [0, 7]
    assert (700, 7) in chunk_graph_keys(700, 8, 16384, True)
    tight = chunk_graph_keys(700, 8, 706, True)  # a 706-token budget: 699 tokens beside 7 decodes
    assert (699, 7) in tight and max(t + d for t, d in tight) == 706
    assert chunk_graph_keys(64, 16, 64, True) == [(16, 0), (32, 0), (49, 15), (57, 7), (64, 0)]  # 64-token steps
    assert chunk_graph_keys(0, 256, 16384, True) == []


def test_which_graph_a_step_replays():
    """The fewest padded tokens; on a tie the fewer decode slots (a chunk alone keeps its graph
    without empty sequences); None when nothing holds the step."""
    from folio.worker.cuda_graphs import CudaGraphRunner

    runner = CudaGraphRunner(None, None, [1])  # type: ignore[arg-type]
    runner.chunk_graphs = dict.fromkeys(chunk_graph_keys(4096, 256, 4096, with_decodes=True))
    assert runner.chunk_bucket_for(300) == (512, 0)
    assert runner.chunk_bucket_for(300, 3) == (512, 7)
    assert runner.chunk_bucket_for(300, 8) == (512, 16)
    assert runner.chunk_bucket_for(3841, 0) == (4096, 0)  # not (3841, 255): the same 4,096 tokens
    assert runner.chunk_bucket_for(3000, 3) == (4089, 7)  # the 4,096-token budget less 7 slots
    assert runner.chunk_bucket_for(100, 300) is None and runner.chunk_bucket_for(5000) is None


def test_graphs_beside_decodes_are_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv("FOLIO_CHUNK_GRAPH_DECODES", raising=False)
    assert chunk_graph_keys(1024, 256, 16384) == chunk_graph_keys(1024, 256, 16384, with_decodes=True)
    monkeypatch.setenv("FOLIO_CHUNK_GRAPH_DECODES", "0")
    assert chunk_graph_keys(1024, 256, 16384) == [(s, 0) for s in chunk_graph_sizes(1024)]
    monkeypatch.setenv("FOLIO_CHUNK_GRAPH_DECODES", "yes")
    with pytest.raises(ValueError, match="FOLIO_CHUNK_GRAPH_DECODES"):
        chunk_graph_keys(1024, 256, 16384)


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ([(0, 700)], (700, 0)),  # a prompt alone
        ([(5000, 100)], (100, 0)),  # the next turn of a chat, on a cached prefix
        ([(0, 2)], (2, 0)),
        ([(300, 1)], None),  # a decode: the decode graphs
        ([(0, 300), (40, 1), (90, 1)], (300, 2)),  # a new request joining two running ones
        ([(0, 300), (0, 20)], None),  # two chunks
    ],
)
def test_which_steps_qualify(shapes, expected):
    assert chunk_step_shape(_step(shapes)) == expected


def test_a_step_with_drafts_does_not_qualify():
    for shapes in ([(30, 4)], [(30, 4), (50, 1)]):
        step = _step(shapes)
        last = step.scheduled[-1]
        step.scheduled[-1] = dataclasses.replace(last, spec_token_ids=(5, 6, 7)[: last.num_new_tokens - 1] or (5,))
        assert chunk_step_shape(_step(shapes)) is not None and chunk_step_shape(step) is None


def _frozen(md):  # noqa: ANN001, ANN202
    """A copy of the metadata that the builder's next step cannot overwrite."""
    return type(md)(**{**vars(md), "query_start_loc": md.query_start_loc.clone(), "seq_lens": md.seq_lens.clone(),
                       "block_tables": md.block_tables.clone(), "slot_mapping": md.slot_mapping.clone()})


@pytest.mark.parametrize("shapes", [[(9, 7)], [(0, 21)], [(30, 1), (9, 7), (3, 1)], [(30, 1), (9, 20), (3, 1)]])
def test_a_padded_chunk_attends_as_the_plain_step(shapes):
    """A chunk on a cached prefix, a fresh one, and one between two decodes, padded to 32 chunk
    tokens and 4 decode slots: the padding writes nothing and both backends give the plain step's
    attention on the real rows."""
    out = _step(shapes)
    n, seqs = sum(new for _, new in shapes), len(shapes)
    builder = StepInputBuilder(64, 8, 64, BLOCK, torch.device("cpu"))
    plain = _frozen(builder.build(out, {}).attn_metadata)
    slots = 4 if seqs > 1 else 0
    inputs = builder.build(out, {}, pad_to=1 + slots, pad_tokens_to=32 + slots)
    md, total = inputs.attn_metadata, 32 + slots
    assert md.num_seqs == max(seqs, 1 + slots) and md.num_actual_tokens == n and inputs.num_tokens == n
    assert md.query_start_loc.tolist() == plain.query_start_loc.tolist() + [n] * (md.num_seqs - seqs)
    assert md.seq_lens.tolist() == plain.seq_lens.tolist() + [0] * (md.num_seqs - seqs)
    assert md.slot_mapping.tolist() == plain.slot_mapping.tolist() + [-1] * (total - n)
    assert inputs.input_ids.shape[0] == inputs.positions.shape[0] == total and not inputs.input_ids[n:].any()
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, 20000, BLOCK, 2, 16, generator=gen)
    query = torch.randn(total, 4, 16, generator=gen)
    want = TorchAttentionBackend().forward(query[:n], kv_cache, plain, 0.25)
    torch.testing.assert_close(TorchAttentionBackend().forward(query, kv_cache, md, 0.25)[:n], want)
    got = TritonAttentionBackend().forward(query, kv_cache, md, 0.25)
    torch.testing.assert_close(got[:n], want, atol=1e-5, rtol=1e-5)
    if max(new for _, new in shapes) * 2 > 16:  # in 16 bits such a batch takes the prefill kernel, empty sequences too
        backend = TritonAttentionBackend()
        assert backend.prefill_config(torch.bfloat16, 16, 2, md) is not None
        got = backend.forward(query.bfloat16(), kv_cache.bfloat16(), md, 0.25)
        torch.testing.assert_close(got[:n].float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("decodes", [0, 3])
def test_the_capture_and_the_replays_share_the_buffers_the_graph_reads(decodes):
    """A graph reads fixed addresses: the capture's inputs and a later padded build of a real step
    are views of the same device buffers, and the capture describes one sequence of `size` new
    tokens (and `decodes` one-token sequences), writing nothing."""
    builder = StepInputBuilder(64, 8, 256, BLOCK, torch.device("cpu"))
    capture = builder.chunk_capture_inputs(32, decodes)
    cmd = _frozen(capture.attn_metadata)
    assert (cmd.num_seqs, cmd.max_query_len, cmd.is_decode_only) == (1 + decodes, 32, False)
    assert cmd.query_start_loc.tolist() == [0] + [32 + i for i in range(1 + decodes)]
    assert cmd.seq_lens.tolist() == [32] + [1] * decodes
    assert cmd.slot_mapping.tolist() == [-1] * (32 + decodes) and not cmd.block_tables[: 1 + decodes, :8].any()
    step = _step([(40, 20)] + [(7, 1)] * decodes)
    replay = builder.build(step, {}, pad_to=1 + decodes, pad_tokens_to=32 + decodes)
    md = replay.attn_metadata
    for a, b in ((capture.input_ids, replay.input_ids), (capture.positions, replay.positions),
                 (capture.attn_metadata.slot_mapping, md.slot_mapping),
                 (capture.attn_metadata.query_start_loc, md.query_start_loc),
                 (capture.attn_metadata.seq_lens, md.seq_lens), (capture.attn_metadata.block_tables, md.block_tables)):
        assert a.data_ptr() == b.data_ptr() and a.shape == b.shape
    assert md.seq_lens.tolist() == [60] + [8] * decodes
    with pytest.raises(ValueError, match="exceeds"):
        builder.chunk_capture_inputs(65)  # more tokens than a step holds
    with pytest.raises(ValueError, match="exceeds"):
        builder.chunk_capture_inputs(32, 8)  # more sequences than a step holds
    with pytest.raises(ValueError, match="blocks a sequence"):
        StepInputBuilder(512, 8, 64, BLOCK, torch.device("cpu")).chunk_capture_inputs(128)  # past max_model_len


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_engine_tokens_and_logprobs_do_not_change(tmp_path, monkeypatch, prefix_caching):
    """Greedy tokens and log-probs (and, without prefix caching, prompt log-probs) in float32 with
    every step of one prompt chunk, alone or beside decodes, padded as a chunk graph's step pads
    it (run eagerly here: the CPU has no graphs) equal the plain steps': prompts alone, chunked
    prompts joining running ones (32-token steps), and with prefix caching the next turn of a
    conversation on its cached prefix."""
    from folio import LLM, SamplingParams
    from folio.worker.model_runner import ModelRunner
    from tests.helpers.checkpoints import make_tiny_checkpoint
    from tests.helpers.reference import assert_same_tokens_and_logprobs, tokens_and_logprobs

    path = make_tiny_checkpoint("qwen3", tmp_path / "m")
    rng = random.Random(2)
    turn = [rng.randrange(3, 1000) for _ in range(45)]
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (3, 17, 64, 90)]
    joining = [[rng.randrange(3, 1000) for _ in range(n)] for n in (3, 17, 64, 90)]  # none of it cached
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3,
                            prompt_logprobs=None if prefix_caching else 2)

    def run(padded: bool) -> list:
        taken = []

        def bucket(self, so):
            shape = chunk_step_shape(so) if padded else None
            if shape is None:
                return None
            taken.append((so.scheduled[[s.num_new_tokens > 1 for s in so.scheduled].index(True)].num_computed_tokens,
                          shape[1]))
            slots = shape[1] + 1 if sum(shape) < 32 else shape[1]  # a padded sequence where there is room
            return 32 - slots, slots  # padded to the step's 32-token buffers

        monkeypatch.setattr(ModelRunner, "_chunk_bucket", bucket)
        llm = LLM(model=str(path), dtype="float32", enable_prefix_caching=prefix_caching, seed=0,
                  max_num_batched_tokens=32)
        outs = []
        for p in prompts + [turn, turn + [11, 12, 13, 14, 15, 16, 17]]:  # alone: one request a step
            outs += llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
        outs += llm.generate([{"prompt_token_ids": p} for p in joining], params, use_tqdm=False)
        if padded:
            assert len(taken) >= len(prompts) + 2
            contexts, decodes = [c for c, _ in taken], [d for _, d in taken]
            assert max(decodes) > 0 and max(contexts) > 0  # beside decodes; chunks of a chunked prompt
        return tokens_and_logprobs(outs)

    padded, plain = run(True), run(False)
    assert_same_tokens_and_logprobs(padded, plain)


def test_few_decodes_keep_the_long_chunk_kernels():
    """A chunk beside 1-7 decodes replays a graph of at most PREFILL_MAX_SEQS sequences, whose
    capture took the long-chunk attention kernels as the eager step would."""
    from folio.attention.backends.triton_backend import PREFILL_MAX_SEQS
    from folio.worker.chunk_graphs import DECODE_SLOTS

    assert min(DECODE_SLOTS) + 1 == PREFILL_MAX_SEQS
