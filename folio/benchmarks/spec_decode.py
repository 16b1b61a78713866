"""Speculative decoding benchmark: decode tokens/s with and without speculation on one pair.

    python -m folio.benchmarks.spec_decode --target OUT/target --draft OUT/draft --k 4

Three workloads (each --k value gets its own batch-1 rows), greedy, EOS ignored (every request makes exactly --output-len tokens):
- batch 1, plain prompts (the opening of corpus documents): draft model vs none;
- batch 1, copy-heavy prompts (a document, then an opening of it that no other document shares,
  so the output quotes the prompt): n-gram vs none, --copy-output-len tokens (64), from the
  documents long enough that the whole output is the quote (each row reports `quoted`, the
  fraction of the output that continues a quote of its prompt);
- batch --batch (64), plain prompts, --batch-repeats (4) generate calls: the cost of speculation
  at large batch (draft model and n-gram, and the draft with disable_by_batch_size).
Each workload's engines live side by side (a fixed KV cache each, --batch-blocks; max_num_seqs
at least 16, so that a batch-1 verify step of k + 1 <= 16 tokens has a CUDA graph) and take
turns, one generate call each (a prompt at batch 1, the whole batch at 64), the order rotated
each turn: a drift of the machine falls on all of them alike (session 7 saw one configuration's
tokens/s move 20% between engines run minutes apart). The clock covers `generate` only, after
a warm-up that runs the same prompts for 16 tokens; each row also reports the median of its
per-call ratios to no speculation.
Prints one JSON line per run (tokens/s, speed-up over the same workload without speculation,
acceptance rate, mean accepted length, acceptance per position) and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from folio.benchmarks.throughput import release_device_memory
from folio.demo.corpus import pretraining_documents
from folio.demo.trainer import QUOTE_SEPARATOR


def plain_prompts(n: int) -> list[str]:
    docs = pretraining_documents(0)
    return [" ".join(docs[i % len(docs)].split()[:8]) for i in range(n)]


def copy_prompts(n: int, count_tokens: Callable[[str], int], min_quote_tokens: int) -> list[str]:
    """A document, then its opening again: the fewest words (at least 6) that no other document
    starts with, and 4 more, so a model that learned the corpus continues this document and no
    other. Only documents with min_quote_tokens after that opening (the corpus has many short
    ones): the whole output is then a quote of the prompt."""
    words = [doc.split() for doc in pretraining_documents(0)]
    prompts = []
    for doc in words:
        opening = next((w + 4 for w in range(6, len(doc)) if sum(o[:w] == doc[:w] for o in words) == 1), len(doc))
        head, text = " ".join(doc[:opening]), " ".join(doc)
        if count_tokens(text) - count_tokens(head) >= min_quote_tokens:
            prompts.append(text + QUOTE_SEPARATOR + head)
    if not prompts:
        raise ValueError(f"No corpus document has {min_quote_tokens} tokens after its opening.")
    return [prompts[i % len(prompts)] for i in range(n)]


def quoted_fraction(prompt: list[int], output: list[int]) -> float:
    """The longest start of `output` found contiguous in `prompt`, as a fraction of the output:
    1.0 when the whole output quotes the prompt."""
    best = 0
    for start in (i for i, t in enumerate(prompt) if output and t == output[0]):
        n = 0
        while n < len(output) and start + n < len(prompt) and prompt[start + n] == output[n]:
            n += 1
        best = max(best, n)
    return best / len(output) if output else 0.0


class Timed:
    """One engine under measurement: warmed up on its prompts, then timed generate by generate."""

    def __init__(self, target: str, spec: dict | None, output_len: int, groups: list[list[str]], **engine: Any) -> None:
        from folio import LLM, SamplingParams

        self.llm = LLM(model=target, speculative_config=spec, **engine)
        self.params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
        # Warm-up over the same prompts: Triton specialises kernels on sizes (a prompt length that
        # is a multiple of 16 or not), and a first compile inside the clock would count as decode.
        warm = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        for prompts in groups:
            self.llm.generate(prompts, warm, use_tqdm=False)
        stats = self.llm.llm_engine.scheduler.spec_stats
        self.before = (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
        self.outputs: list = []
        self.seconds: list[float] = []  # one entry per timed generate

    def generate(self, prompts: list[str]) -> float:
        start = time.perf_counter()
        self.outputs += self.llm.generate(prompts, self.params, use_tqdm=False)
        self.seconds.append(time.perf_counter() - start)
        return self.seconds[-1]

    def result(self) -> dict:
        stats = self.llm.llm_engine.scheduler.spec_stats
        drafts, drafted, accepted = (stats.num_drafts - self.before[0], stats.num_draft_tokens - self.before[1],
                                     stats.num_accepted_tokens - self.before[2])
        outputs, seconds = self.outputs, sum(self.seconds)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        return {
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1),
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "mean_accepted_length": round(1 + accepted / drafts, 2) if drafts else None,
            "acceptance_per_position": [round(r, 3) for r in stats.acceptance_rate_per_position()],
            "quoted": round(sum(quoted_fraction(o.prompt_token_ids, o.outputs[0].token_ids) for o in outputs) / len(outputs), 3),
            "outputs": [o.outputs[0].token_ids for o in outputs],
        }

    def close(self) -> None:
        del self.llm
        release_device_memory()


def run_rounds(target: str, specs: list[dict | None], groups: list[list[str]], output_len: int,
               **engine: Any) -> list[dict]:
    """Every configuration's engine at once, taking turns: for each group of prompts (one
    generate call: a single prompt for batch 1, the whole batch for the big one), each engine
    generates it, the order rotated from group to group, so a drift of the machine falls on
    all of them alike. Each result adds `round_ratios`, the first configuration's seconds over
    its own per group, and their median, `median_ratio`."""
    engines = [Timed(target, spec, output_len, groups, **engine) for spec in specs]
    for r, prompts in enumerate(groups):
        for i in range(len(engines)):
            engines[(i + r) % len(engines)].generate(prompts)
    results = [e.result() for e in engines]
    base = engines[0].seconds
    for e, result in zip(engines, results):
        ratios = [b / s for b, s in zip(base, e.seconds)]
        result["round_ratios"] = [round(x, 3) for x in ratios]
        result["median_ratio"] = round(statistics.median(ratios), 3)
    for e in engines:
        e.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--k", type=int, nargs="+", default=[4], help="num_speculative_tokens (several: a row each)")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--copy-output-len", type=int, default=64, help="tokens per copy-heavy request")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8, help="batch-1 requests, run one after another")
    parser.add_argument("--batch-repeats", type=int, default=4, help="rounds of the --batch engines (one generate each)")
    parser.add_argument("--batch-blocks", type=int, default=4096, help="KV blocks of each engine (they share the device)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    # Each workload's engines side by side: a fixed KV cache each instead of a memory share.
    engine = dict(device=args.device, max_model_len=1024, num_gpu_blocks_override=args.batch_blocks)
    drafts = [{"model": args.draft, "num_speculative_tokens": k} for k in args.k]
    ngrams = [
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2} for k in args.k
    ]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    copying = copy_prompts(args.prompts, lambda text: len(tokenizer(text).input_ids), args.copy_output_len)
    big = f"batch {args.batch}, plain"
    big_specs = [None, drafts[0], ngrams[0], {**drafts[0], "disable_by_batch_size": 32}]
    baseline: dict[str, tuple[float, list]] = {}  # workload -> (tokens/s, outputs) without speculation
    rows = []

    def report(workload: str, spec: dict | None, result: dict) -> None:
        outputs = result.pop("outputs")
        if spec is None:
            baseline[workload] = (result["tokens_per_s"], outputs)
        base_tokens_per_s, base_outputs = baseline[workload]
        result["speedup"] = round(result["tokens_per_s"] / base_tokens_per_s, 2)
        result["same_outputs_as_no_speculation"] = outputs == base_outputs
        method = "none" if spec is None else json.dumps(spec)
        print(json.dumps({"workload": workload, "speculation": method, **result}), flush=True)
        rows.append((workload, method, result))

    for workload, specs, groups, output_len, seqs in (
        ("batch 1, plain", [None, *drafts], [[p] for p in plain_prompts(args.prompts)], args.output_len, 16),
        ("batch 1, copy-heavy", [None, *ngrams], [[p] for p in copying], args.copy_output_len, 16),
        (big, big_specs, [plain_prompts(args.batch)] * args.batch_repeats, args.output_len, args.batch),
    ):
        for spec, result in zip(specs, run_rounds(args.target, specs, groups, output_len, max_num_seqs=seqs, **engine)):
            report(workload, spec, result)
    print("\n| workload | speculation | tok/s | speed-up (median per round) | acceptance | mean accepted length | quoted | same outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for workload, method, r in rows:
        median = f" ({r['median_ratio']}x)" if "median_ratio" in r else ""
        print(f"| {workload} | `{method}` | {r['tokens_per_s']} | {r['speedup']}x{median} | {r['acceptance_rate']} "
              f"| {r['mean_accepted_length']} | {r['quoted']} | {r['same_outputs_as_no_speculation']} |")


if __name__ == "__main__":
    main()
