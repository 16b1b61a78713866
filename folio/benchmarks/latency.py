"""`folio bench latency`: time to first token of one long prompt, and decode speed at batch 1 and 64.

Each figure comes from timed `generate` calls (the same calls for folio and, with `--peer vllm`,
for vLLM in a child process):
- time to first token of an N-token prompt: one prompt, max_tokens 1, median of `repeat` calls;
- decode at batch B: B prompts of `decode_prompt_len` tokens timed with max_tokens 1 and with
  max_tokens 1 + decode_steps (513 by default); the difference is decode_steps decode steps, so
  ms per token = difference / decode_steps and tok/s = B × decode_steps / difference.
Every call is preceded by one untimed call of the same shape (kernel compilation, graph capture),
and every request must produce exactly its max_tokens (EOS ignored). Every call's prompts start
with a token of their own (TimedCall.unique_prefix_below), so no call is served from the prefix
cache that an earlier one filled: both engines cache prefixes by default, and a cached 30k prompt
"prefills" in one block.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any

from folio.benchmarks.vllm_peer import CallResult, TimedCall, time_calls


@dataclass(frozen=True)
class LatencySpec:
    prompt_lens: tuple[int, ...] = (8192, 30000)
    batch_sizes: tuple[int, ...] = (1, 64)
    decode_prompt_len: int = 128
    decode_steps: int = 512
    repeat: int = 3
    temperature: float = 0.0
    vocab_limit: int = 10001
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.prompt_lens + self.batch_sizes, default=1) < 1 or self.decode_prompt_len < 1:
            raise ValueError("Prompt lengths, batch sizes and --decode-prompt-len must be >= 1.")
        if self.decode_steps < 1 or self.repeat < 1:
            raise ValueError("--decode-steps and --repeat must be >= 1.")

    @property
    def max_model_len(self) -> int:
        return max(max(self.prompt_lens, default=0) + 1, self.decode_prompt_len + 1 + self.decode_steps)

    def calls(self) -> list[TimedCall]:
        rng = random.Random(self.seed)

        def prompt(n: int) -> list[int]:
            return [rng.randrange(self.vocab_limit) for _ in range(n)]

        def call(name: str, prompts: list[list[int]], max_tokens: int) -> TimedCall:
            return TimedCall(name, prompts, [max_tokens] * len(prompts), self.temperature, self.repeat,
                             unique_prefix_below=self.vocab_limit, salt=len(calls))

        calls: list[TimedCall] = []
        for n in self.prompt_lens:
            calls.append(call(f"ttft {n}", [prompt(n)], 1))
        for b in self.batch_sizes:
            prompts = [prompt(self.decode_prompt_len) for _ in range(b)]
            calls.append(call(f"batch {b} max_tokens 1", prompts, 1))
            calls.append(call(f"batch {b} max_tokens {1 + self.decode_steps}", prompts, 1 + self.decode_steps))
        return calls


@dataclass(frozen=True)
class LatencyRow:
    name: str  # "ttft 8192", "decode batch 64"
    value: float
    unit: str  # "ms" or "ms/token" or "tok/s"
    exact: bool  # every request produced exactly its max_tokens


def summarise(spec: LatencySpec, results: list[CallResult]) -> list[LatencyRow]:
    """The report's rows from the calls' results (in spec.calls() order)."""
    by_name = {r.name: r for r in results}
    wanted = {c.name: c.max_tokens for c in spec.calls()}

    def median(name: str) -> float:
        return statistics.median(by_name[name].elapsed_s)

    def exact(*names: str) -> bool:
        return all(by_name[n].produced == wanted[n] for n in names)

    rows = [LatencyRow(f"ttft {n}", 1e3 * median(f"ttft {n}"), "ms", exact(f"ttft {n}")) for n in spec.prompt_lens]
    for b in spec.batch_sizes:
        short, long = f"batch {b} max_tokens 1", f"batch {b} max_tokens {1 + spec.decode_steps}"
        delta = median(long) - median(short)  # decode_steps decode steps
        ok = exact(short, long)
        per_token = 1e3 * delta / spec.decode_steps if delta > 0 else float("nan")  # nan: lost in noise
        rate = b * spec.decode_steps / delta if delta > 0 else float("nan")
        rows.append(LatencyRow(f"decode batch {b}", per_token, "ms/token", ok))
        rows.append(LatencyRow(f"decode batch {b}", rate, "tok/s", ok))
    return rows


def run_calls(llm: Any, calls: list[TimedCall]) -> list[CallResult]:
    """folio's side of a job: the same calls through `LLM.generate`, timed as the vLLM child does."""
    from folio import SamplingParams

    return time_calls(llm, calls, SamplingParams)


def format_rows(systems: dict[str, list[LatencyRow]]) -> str:
    """One column per system, and folio / peer ratios where lower or higher is better."""
    names = list(systems)
    width = max(16, *(len(n) + 2 for n in names))
    lines = [f"{'':<24} {'unit':<9}" + "".join(f"{n:>{width}}" for n in names)
             + ("".join(f"{'folio vs ' + n:>{width + 10}}" for n in names[1:]))]
    first = systems[names[0]]
    for i, row in enumerate(first):
        values = [systems[n][i] for n in names]
        cells = "".join(f"{v.value:>{width - 1},.2f}{' ' if v.exact else '!'}" for v in values)
        ratios = "".join(f"{_better(row, v):>{width + 10}}" for v in values[1:])
        lines.append(f"{row.name:<24} {row.unit:<9}{cells}{ratios}")
    lines.append("('!' marks a figure where some request did not produce exactly its max_tokens; "
                 "'folio vs' > 1 means folio is better)")
    return "\n".join(lines)


def _better(folio: LatencyRow, peer: LatencyRow) -> str:
    """How many times better folio is: peer/folio for times, folio/peer for rates."""
    if not (folio.value > 0 and peer.value > 0):  # also nan
        return "-"
    ratio = folio.value / peer.value if folio.unit == "tok/s" else peer.value / folio.value
    return f"{ratio:.2f}x"
