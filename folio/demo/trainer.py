"""A short, seeded training run that teaches the demo model its corpus (seconds on one CPU thread).

Deterministic on one machine: the weights are initialised from a fixed seed inside a forked RNG
(the caller's random state is untouched), batches come from a private generator, and the run
uses a fixed number of CPU threads, since the thread count changes how sums are split and so
the last bits of every result. Another CPU (other SIMD width) may give slightly different weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from folio.demo.corpus import chat_conversations, pretraining_documents
from folio.transformers_utils.chat_template import render_chat

T = TypeVar("T")


@dataclass(frozen=True)
class TrainingRecipe:
    steps: int = 200
    batch_size: int = 12
    seq_len: int = 64
    lr: float = 5e-3
    seed: int = 0
    num_threads: int = 1  # fixed: results depend on it; one thread also suffers least from a busy CPU
    chat_repeats: int = 2  # chats are short: seen twice so the turn format and <|im_end|> stick
    # Documents quoted after themselves ("doc\n\ndoc"), this many times each: a model that has
    # seen text repeat can continue a quote of its prompt (speculation's copy-heavy benchmark).
    quote_repeats: int = 0


@dataclass(frozen=True)
class TrainingResult:
    first_loss: float
    final_loss: float
    seconds: float


QUOTE_SEPARATOR = "\n\n"  # between a document and its quote


def training_tokens(tokenizer: Any, recipe: TrainingRecipe) -> list[int]:
    """The corpus as one token stream: documents, quoted documents (quote_repeats), then ChatML
    conversations, each ended by eos."""
    eos = tokenizer.eos_token_id
    tokens: list[int] = []
    for doc in pretraining_documents(recipe.seed):
        tokens += tokenizer.encode(doc) + [eos]
    for _ in range(recipe.quote_repeats):
        for doc in pretraining_documents(recipe.seed):
            tokens += tokenizer.encode(doc + QUOTE_SEPARATOR + doc) + [eos]
    for _ in range(recipe.chat_repeats):
        for conversation in chat_conversations(recipe.seed):
            text = render_chat(tokenizer.chat_template, conversation, add_generation_prompt=False)
            tokens += tokenizer.encode(text) + [eos]
    return tokens


def init_seeded(build: Callable[[], T], seed: int) -> T:
    """Call `build()` (which creates random weights) with the global RNG seeded, then restored."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def train(model: torch.nn.Module, tokens: list[int], recipe: TrainingRecipe) -> TrainingResult:
    """Next-token training on random windows of `tokens`, AdamW with a one-cycle learning rate."""
    data = torch.tensor(tokens, dtype=torch.long)  # [num_tokens]
    if len(data) <= recipe.seq_len + 1:
        raise ValueError(f"The training text ({len(data)} tokens) is shorter than one window.")
    generator = torch.Generator().manual_seed(recipe.seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=recipe.lr, total_steps=recipe.steps, pct_start=0.1
    )
    start, losses = time.perf_counter(), []
    model.train()
    for _ in range(recipe.steps):
        starts = torch.randint(0, len(data) - recipe.seq_len, (recipe.batch_size,), generator=generator)
        batch = torch.stack([data[s : s + recipe.seq_len] for s in starts.tolist()])  # [batch, seq]
        batch = batch.to(device)  # the model's device (a GPU trains the benchmark pairs)
        # bf16 autocast on a GPU (the benchmark pairs): ~3x faster than float32 there, and the
        # weights stay float32; the CPU keeps float32 (the demo model's training is pinned).
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return TrainingResult(losses[0], losses[-1], time.perf_counter() - start)


@contextmanager
def fixed_threads(num_threads: int) -> Iterator[None]:
    """Run the block with `num_threads` intra-op threads, then restore the caller's setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
