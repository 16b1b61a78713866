"""Benchmark workloads: lists of token-id prompts, each with the exact number of tokens to generate.

W1 is nano-vllm's published throughput workload, reproduced draw for draw (DESIGN.md):
`random.seed(0)`; 256 prompts of randint(100, 1024) tokens drawn from randint(0, 10000); then 256
output lengths randint(100, 1024). EOS is ignored, so every request generates exactly its length
(133,966 output tokens in all).

`random` draws lengths uniformly in [len * (1 - range_ratio), len * (1 + range_ratio)] and token
ids uniformly below `vocab_limit`, as vLLM's random dataset does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

W1_NUM_REQUESTS = 256
W1_MIN_LEN = 100
W1_MAX_LEN = 1024
W1_MAX_TOKEN_ID = 10000  # inclusive: randint(0, 10000)


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int  # exactly this many tokens are generated (EOS ignored)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[BenchRequest]

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def max_total_len(self) -> int:
        """The longest prompt + output of any request: the context length the model must allow."""
        return max((r.prompt_len + r.output_len for r in self.requests), default=0)

    def head(self, n: int | None) -> Workload:
        """The first n requests (all of them for None), named so that reports say it is a subset."""
        if n is None or n >= self.num_requests:
            return self
        if n < 1:
            raise ValueError(f"A workload subset needs at least one request, got {n}.")
        return Workload(f"{self.name}[:{n}]", self.requests[:n])

    def describe(self) -> str:
        return (
            f"{self.name}: {self.num_requests} requests, {self.prompt_tokens:,} prompt tokens, "
            f"{self.output_tokens:,} output tokens"
        )


def w1() -> Workload:
    """DESIGN.md's W1, drawn with Python's `random` in exactly nano-vllm's order."""
    rng = random.Random(0)  # the same stream as random.seed(0) on the module-level generator
    prompts = [
        [rng.randint(0, W1_MAX_TOKEN_ID) for _ in range(rng.randint(W1_MIN_LEN, W1_MAX_LEN))]
        for _ in range(W1_NUM_REQUESTS)
    ]
    output_lens = [rng.randint(W1_MIN_LEN, W1_MAX_LEN) for _ in range(W1_NUM_REQUESTS)]
    return Workload("w1", [BenchRequest(p, n) for p, n in zip(prompts, output_lens)])


def random_workload(
    input_len: int,
    output_len: int,
    num_prompts: int,
    *,
    range_ratio: float = 0.0,
    vocab_limit: int = W1_MAX_TOKEN_ID + 1,
    seed: int = 0,
) -> Workload:
    """num_prompts requests with lengths drawn around input_len / output_len."""
    _check_positive(input_len=input_len, output_len=output_len, num_prompts=num_prompts, vocab_limit=vocab_limit)
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}.")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        n_in = _draw_len(rng, input_len, range_ratio)
        n_out = _draw_len(rng, output_len, range_ratio)
        requests.append(BenchRequest([rng.randrange(vocab_limit) for _ in range(n_in)], n_out))
    name = f"random(in={input_len}, out={output_len}, n={num_prompts}, ratio={range_ratio:g})"
    return Workload(name, requests)


def _draw_len(rng: random.Random, length: int, ratio: float) -> int:
    low = max(1, int(length * (1 - ratio)))
    high = max(low, int(length * (1 + ratio)))
    return rng.randint(low, high)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


WORKLOADS = ("w1", "random")


def make_workload(
    name: str,
    *,
    input_len: int | None = None,
    output_len: int | None = None,
    num_prompts: int | None = None,
    range_ratio: float = 0.0,
    vocab_size: int | None = None,
    seed: int = 0,
) -> Workload:
    """The workload a command line names; `random` needs the three lengths/counts."""
    if name == "w1":
        workload = w1()
        return workload.head(num_prompts) if num_prompts is not None else workload
    if name == "random":
        missing = [f for f, v in (("--input-len", input_len), ("--output-len", output_len),
                                  ("--num-prompts", num_prompts)) if v is None]
        if missing:
            raise ValueError(f"The random workload needs {', '.join(missing)}.")
        limit = min(vocab_size, W1_MAX_TOKEN_ID + 1) if vocab_size else W1_MAX_TOKEN_ID + 1
        return random_workload(input_len, output_len, num_prompts, range_ratio=range_ratio,
                               vocab_limit=limit, seed=seed)
    raise ValueError(f"Unknown workload {name!r}; known: {', '.join(WORKLOADS)}.")
