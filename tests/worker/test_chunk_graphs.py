"""Chunk graphs (worker/chunk_graphs.py): which sizes a model gets, which steps replay one, that a
chunk padded to a graph's tokens attends as the plain step on its real rows, that the capture and
the replays share the buffers the graph reads, and that the engine's tokens and log-probs do not
change when one-request prompt chunks run padded (forced on the CPU, where there are no graphs)."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.attention.backends.triton_backend import TritonAttentionBackend
from folio.worker.chunk_graphs import chunk_graph_cap, chunk_graph_sizes, linear_params_per_token, takes_chunk_graph
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


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ([(0, 700)], True),  # a prompt alone
        ([(5000, 100)], True),  # the next turn of a chat, on a cached prefix
        ([(0, 2)], True),
        ([(300, 1)], False),  # a decode: the decode graphs
        ([(0, 300), (40, 1)], False),  # a prompt among decodes: eager, or per-token graphs
    ],
)
def test_which_steps_qualify(shapes, expected):
    assert takes_chunk_graph(_step(shapes)) is expected


def test_a_step_with_drafts_does_not_qualify():
    step = _step([(30, 4)])
    step.scheduled[0] = dataclasses.replace(step.scheduled[0], spec_token_ids=(5, 6, 7))
    assert takes_chunk_graph(_step([(30, 4)])) and not takes_chunk_graph(step)


def _frozen(md):  # noqa: ANN001, ANN202
    """A copy of the metadata that the builder's next step cannot overwrite."""
    return type(md)(**{**vars(md), "query_start_loc": md.query_start_loc.clone(), "seq_lens": md.seq_lens.clone(),
                       "block_tables": md.block_tables.clone(), "slot_mapping": md.slot_mapping.clone()})


@pytest.mark.parametrize("shape", [(9, 7), (0, 21)])
def test_a_padded_chunk_attends_as_the_plain_step(shape):
    """A chunk on a cached prefix (and a fresh one) padded to 32 tokens: one sequence still, the
    padding writes nothing, and both backends give the plain step's attention on the real rows."""
    out = _step([shape])
    n = shape[1]
    builder = StepInputBuilder(64, 8, 64, BLOCK, torch.device("cpu"))
    plain = _frozen(builder.build(out, {}).attn_metadata)
    inputs = builder.build(out, {}, pad_tokens_to=32)
    md = inputs.attn_metadata
    assert md.num_seqs == 1 and md.num_actual_tokens == n and inputs.num_tokens == n
    assert md.query_start_loc.tolist() == [0, n] and md.seq_lens.tolist() == plain.seq_lens.tolist()
    assert md.slot_mapping.tolist() == plain.slot_mapping.tolist() + [-1] * (32 - n)
    assert inputs.input_ids.shape[0] == inputs.positions.shape[0] == 32 and not inputs.input_ids[n:].any()
    assert inputs.logits_indices is not None and inputs.logits_indices.tolist() == [n - 1]
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, 20000, BLOCK, 2, 16, generator=gen)
    query = torch.randn(32, 4, 16, generator=gen)
    want = TorchAttentionBackend().forward(query[:n], kv_cache, plain, 0.25)
    torch.testing.assert_close(TorchAttentionBackend().forward(query, kv_cache, md, 0.25)[:n], want)
    got = TritonAttentionBackend().forward(query, kv_cache, md, 0.25)
    torch.testing.assert_close(got[:n], want, atol=1e-5, rtol=1e-5)


def test_the_capture_and_the_replays_share_the_buffers_the_graph_reads():
    """A graph reads fixed addresses: the capture's inputs and a later padded build of a real chunk
    are views of the same device buffers, and the capture describes one sequence of `size` new
    tokens (the kernels a chunk of that size gets), writing nothing."""
    builder = StepInputBuilder(64, 8, 256, BLOCK, torch.device("cpu"))
    capture = builder.chunk_capture_inputs(32)
    cmd = _frozen(capture.attn_metadata)
    assert (cmd.num_seqs, cmd.max_query_len, cmd.is_decode_only) == (1, 32, False)
    assert cmd.query_start_loc.tolist() == [0, 32] and cmd.seq_lens.tolist() == [32]
    assert cmd.slot_mapping.tolist() == [-1] * 32 and cmd.block_tables[0, :8].tolist() == [0] * 8
    replay = builder.build(_step([(40, 20)]), {}, pad_tokens_to=32)
    md = replay.attn_metadata
    for a, b in ((capture.input_ids, replay.input_ids), (capture.positions, replay.positions),
                 (capture.attn_metadata.slot_mapping, md.slot_mapping),
                 (capture.attn_metadata.query_start_loc, md.query_start_loc),
                 (capture.attn_metadata.seq_lens, md.seq_lens), (capture.attn_metadata.block_tables, md.block_tables)):
        assert a.data_ptr() == b.data_ptr() and a.shape == b.shape
    assert md.seq_lens.tolist() == [60]
    with pytest.raises(ValueError, match="exceeds"):
        builder.chunk_capture_inputs(65)  # more tokens than a step holds
    with pytest.raises(ValueError, match="blocks a sequence"):
        StepInputBuilder(512, 8, 64, BLOCK, torch.device("cpu")).chunk_capture_inputs(128)  # past max_model_len


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_engine_tokens_and_logprobs_do_not_change(tmp_path, monkeypatch, prefix_caching):
    """Greedy tokens and log-probs (and, without prefix caching, prompt log-probs) in float32 with
    every one-request prompt chunk padded as a chunk graph's step pads it (run eagerly here: the
    CPU has no graphs) equal the plain steps': prompts alone, and with prefix caching the next
    turn of a conversation on its cached prefix."""
    from folio import LLM, SamplingParams
    from folio.worker.model_runner import ModelRunner
    from tests.helpers.checkpoints import make_tiny_checkpoint
    from tests.helpers.reference import assert_same_tokens_and_logprobs, tokens_and_logprobs

    path = make_tiny_checkpoint("qwen3", tmp_path / "m")
    rng = random.Random(2)
    turn = [rng.randrange(3, 1000) for _ in range(45)]
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (3, 17, 64, 90)]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3,
                            prompt_logprobs=None if prefix_caching else 2)

    def run(padded: bool) -> list:
        taken = []

        def bucket(self, so):
            if not (padded and takes_chunk_graph(so)):
                return None
            taken.append(so.scheduled[0].num_computed_tokens)
            return -(-so.total_num_scheduled_tokens // 16) * 16 + 16  # always some padding

        monkeypatch.setattr(ModelRunner, "_chunk_bucket", bucket)
        llm = LLM(model=str(path), dtype="float32", enable_prefix_caching=prefix_caching, seed=0)
        outs = []
        for p in prompts + [turn, turn + [11, 12, 13, 14, 15, 16, 17]]:  # alone: one request a step
            outs += llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
        if padded:
            assert len(taken) >= len(prompts) + 2
            assert max(taken) > 0 if prefix_caching else max(taken) == 0
        return tokens_and_logprobs(outs)

    padded, plain = run(True), run(False)
    assert_same_tokens_and_logprobs(padded, plain)
