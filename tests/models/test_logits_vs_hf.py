"""folio's logits equal transformers' for every architecture, however the tokens are batched.

One random prompt per kind runs (a) as one prefill, (b) in uneven chunks, (c) as a prefix then
token by token, and (d) with two more sequences in flat mixed batches of prefill chunks and
decodes; blocks come from a shuffled pool, at block sizes 16 and 4.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.helpers.checkpoints import KINDS
from tests.helpers.paged_batch import PagedKV, blocks_needed, run_schedule
from tests.models.conftest import hf_logits, load_folio

ATOL = 1e-4
MODES = ("prefill", "chunks", "decode", "mixed")


def _prompts(kind: str) -> list[list[int]]:
    rng = random.Random(KINDS.index(kind))
    return [[rng.randrange(1000) for _ in range(n)] for n in (rng.randrange(90, 131), 57, 74)]


def _chunked(tokens: list[int], sizes: list[int]) -> list[list[int]]:
    out, start, i = [], 0, 0
    while start < len(tokens):
        out.append(tokens[start : start + sizes[i % len(sizes)]])
        start += len(out[-1])
        i += 1
    return out


def _mixed_schedule(prompts: list[list[int]], seed: int) -> list[list[tuple[int, list[int]]]]:
    """Each step every sequence that has started takes a chunk of 1 to 30 tokens (1 half the time);
    sequence i joins at step i, so prefill chunks and decodes of different sequences share steps."""
    rng = random.Random(seed)
    done = [0] * len(prompts)
    schedule, step = [], 0
    while any(d < len(p) for d, p in zip(done, prompts)):
        chunks = []
        for seq, prompt in enumerate(prompts):
            if seq <= step and done[seq] < len(prompt):
                n = 1 if rng.random() < 0.5 else rng.randrange(2, 31)
                chunks.append((seq, prompt[done[seq] : done[seq] + n]))
                done[seq] += len(chunks[-1][1])
        rng.shuffle(chunks)
        schedule.append(chunks)
        step += 1
    return schedule


def _schedule(mode: str, prompts: list[list[int]]) -> list[list[tuple[int, list[int]]]]:
    prompt = prompts[0]
    if mode == "prefill":
        return [[(0, prompt)]]
    if mode == "chunks":
        return [[(0, c)] for c in _chunked(prompt, [13, 1, 29, 2, 17])]
    if mode == "decode":
        split = len(prompt) - 40  # past Mistral's and qwen2_swa's windows, over block edges
        return [[(0, prompt[:split])]] + [[(0, [t])] for t in prompt[split:]]
    return _mixed_schedule(prompts, seed=len(prompt))


@pytest.fixture(scope="module")
def reference(checkpoint_dir):
    """kind -> (folder, prompts, transformers' logits per prompt), computed once per kind."""
    cache: dict[str, tuple] = {}

    def get(kind: str):
        if kind not in cache:
            path = checkpoint_dir(kind)
            prompts = _prompts(kind)
            cache[kind] = (path, prompts, hf_logits(path, prompts))
        return cache[kind]

    return get


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(reference, kind, mode, block_size):
    path, prompts, expected = reference(kind)
    model = load_folio(path)
    schedule = _schedule(mode, prompts)
    used = sorted({seq for step in schedule for seq, _ in step})
    args = model.attention_layers()[0]
    kv = PagedKV(
        model,
        args.num_kv_heads,
        args.head_dim,
        blocks_needed([len(prompts[s]) for s in used], block_size),
        block_size,
        seed=block_size,
    )
    got = run_schedule(kv, schedule)
    for seq in used:
        torch.testing.assert_close(got[seq], expected[seq], atol=ATOL, rtol=0)
