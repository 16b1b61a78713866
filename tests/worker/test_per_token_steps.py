"""Small steps with prompt tokens as per-token sequences (worker/per_token_steps.py): which steps
qualify, that the per-token build of a prompt step attends exactly as the plain one, and that
the engine's tokens do not change when such steps take that layout."""

from __future__ import annotations

import random

import pytest
import torch

from folio.attention.backends.torch_ref import TorchAttentionBackend
from folio.attention.backends.triton_backend import TritonAttentionBackend
from folio.core.scheduler_output import SchedulerOutput
from folio.worker import per_token_steps
from folio.worker.per_token_steps import read_budget, takes_per_token_step
from folio.worker.step_inputs import StepInputBuilder
from tests.worker.test_step_inputs import BLOCK, _Seq


def _step(shapes: list[tuple[int, int]]) -> SchedulerOutput:
    """One scheduled request per (cached tokens, new tokens)."""
    rng = random.Random(0)
    free = list(range(1, 20000))
    batch = []
    for i, (cached, new) in enumerate(shapes):
        seq = _Seq(f"r{i}", cached + new, free, rng)
        if cached:
            seq.schedule(cached)
        batch.append(seq.schedule(new))
    return SchedulerOutput(batch, sum(n for _, n in shapes))


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ([(0, 256)], True),  # a 256-token prompt alone: 256 * 128 = 32,768 reads, the budget
        ([(0, 257)], False),  # more tokens than the largest graph
        ([(0, 200)] + [(50, 1)] * 56, True),  # a prompt among decodes, 256 tokens in all
        ([(1000, 100)], False),  # a chunk on a long cached prefix: 100 * 1,050 reads
        ([(100, 150)], True),  # 150 * 175 = 26,250
        ([(300, 1)] * 64, False),  # decode-only: the plain decode graphs already replay it
    ],
)
def test_which_steps_qualify(shapes, expected):
    assert takes_per_token_step(_step(shapes), 256) is expected


def test_the_switch(monkeypatch):
    monkeypatch.setattr(per_token_steps, "ENABLED", False)
    assert not takes_per_token_step(_step([(0, 16)]), 256)


def test_the_budget_shrinks_for_models_that_cache_more_a_token():
    """Measured with 4 KiB of K/V a token and layer; a model with 4x that gets a quarter of the
    reads (never more than measured for smaller K/V)."""
    assert read_budget(4096) == read_budget(1024) == 32768
    assert read_budget(16384) == 8192
    prompt = _step([(0, 200)])  # 200 * 100 = 20,000 reads
    assert takes_per_token_step(prompt, 256, read_budget(4096))
    assert not takes_per_token_step(prompt, 256, read_budget(16384))


def test_a_prompt_step_as_per_token_sequences_attends_as_the_plain_step():
    """A prompt chunk on a cached prefix, a fresh prompt and a decode: built per token and padded
    to a graph size, the decode kernel's attention equals the reference over the plain build, and
    the logits rows are the same."""
    out = _step([(9, 7), (0, 5), (20, 1)])
    builder = StepInputBuilder(64, 64, 64, BLOCK, torch.device("cpu"))
    plain = builder.build(out, {})
    plain_md = plain.attn_metadata
    plain_md = type(plain_md)(**{**vars(plain_md), "query_start_loc": plain_md.query_start_loc.clone(),
                                 "seq_lens": plain_md.seq_lens.clone(), "block_tables": plain_md.block_tables.clone(),
                                 "slot_mapping": plain_md.slot_mapping.clone()})
    plain_rows = None if plain.logits_indices is None else plain.logits_indices.tolist()
    inputs = builder.build(out, {}, pad_to=16, per_token_seqs=True)
    md, n = inputs.attn_metadata, 13
    assert md.is_decode_only and md.num_seqs == 16 and md.slot_mapping[:n].tolist() == plain_md.slot_mapping[:n].tolist()
    assert (None if inputs.logits_indices is None else inputs.logits_indices.tolist()) == plain_rows == [6, 11, 12]
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, 20000, BLOCK, 2, 16, generator=gen)
    query = torch.randn(16, 4, 16, generator=gen)
    want = TorchAttentionBackend().forward(query[:n], kv_cache, plain_md, 0.25)
    torch.testing.assert_close(TorchAttentionBackend().forward(query, kv_cache, md, 0.25)[:n], want, atol=1e-5, rtol=1e-5)
    got = TritonAttentionBackend(num_splits=2).forward(query, kv_cache, md, 0.25)
    torch.testing.assert_close(got[:n], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_engine_tokens_and_logprobs_do_not_change(tmp_path, monkeypatch, prefix_caching):
    """Greedy tokens and their log-probs (and, without prefix caching, prompt log-probs, which
    bypass the cache) in float32 with small prompt steps laid out per token (forced here on the
    CPU, where there are no graphs) equal the plain layout's: short prompts alone and together,
    and with prefix caching a prompt whose first blocks are cached (a chunk on context)."""
    from folio import LLM, SamplingParams
    from folio.worker.model_runner import ModelRunner
    from tests.helpers.checkpoints import make_tiny_checkpoint
    from tests.helpers.reference import assert_same_tokens_and_logprobs, tokens_and_logprobs

    path = make_tiny_checkpoint("qwen3", tmp_path / "m")
    rng = random.Random(1)
    shared = [rng.randrange(3, 1000) for _ in range(40)]
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (5, 33, 70)] + [shared + [7, 8, 9]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3,
                            prompt_logprobs=None if prefix_caching else 2)

    def run(per_token: bool) -> list:
        taken = []

        def rule(self, so):
            took = per_token and takes_per_token_step(so, 256)
            taken.append((took, max(s.num_computed_tokens for s in so.scheduled if s.num_new_tokens > 1)
                          if took else None))
            return took

        monkeypatch.setattr(ModelRunner, "_is_small_graph_step", rule)
        llm = LLM(model=str(path), dtype="float32", enable_prefix_caching=prefix_caching, seed=0)
        first = llm.generate([{"prompt_token_ids": shared + [1, 2]}], params, use_tqdm=False)  # fills the cache
        outs = first + llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        if per_token:
            contexts = [c for took, c in taken if took]
            assert contexts, "some prompt step was laid out per token"
            assert max(contexts) > 0 if prefix_caching else max(contexts) == 0
        return tokens_and_logprobs(outs)

    per_token, plain = run(True), run(False)
    assert_same_tokens_and_logprobs(per_token, plain)
