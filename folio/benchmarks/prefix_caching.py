"""Prefix-caching benchmark: many requests behind one shared system prompt, cache off vs on.

Every request is `system prompt (1,000 tokens by default) + its own question`, greedy, EOS
ignored, all submitted at once through LLM.generate; the same requests run on a fresh engine
with prefix caching off, then on. Reported per run: prompt tokens, prompt tokens the model
actually computed (EngineStats.num_computed_prompt_tokens), the cache hit rate, wall time of the
generate call, mean time to first token, and whether the two runs' tokens are identical. A
short warm-up with unrelated tokens runs first in each engine, so that neither run times
one-time kernel compilation and the warm-up leaves nothing the workload could hit.

    python -m folio.benchmarks.prefix_caching                      # the demo model, CPU or GPU
    python -m folio.benchmarks.prefix_caching --model folio/benchmarks/configs/qwen3-0.6b \\
        --load-format dummy --dtype bfloat16 --num-prompts 256 --json prefix.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from folio.benchmarks.throughput import release_device_memory


@dataclass(frozen=True)
class PrefixRun:
    prefix_caching: bool
    num_requests: int
    prompt_tokens: int
    computed_prompt_tokens: int
    prefix_cache_hit_rate: float
    elapsed_s: float
    mean_ttft_s: float
    output_tokens: int


def make_requests(num: int, system_len: int, question_len: int, vocab: int, seed: int) -> list[list[int]]:
    """One shared system prompt, then per request a question of question_len * (0.5..1.5) tokens."""
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(system_len)]
    lengths = [rng.randint(max(1, question_len // 2), question_len * 3 // 2) for _ in range(num)]
    return [system + [rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def run_once(engine_kwargs: dict[str, Any], prompts: list[list[int]], output_len: int,
             prefix_caching: bool) -> tuple[PrefixRun, list[list[int]]]:
    from folio import LLM, SamplingParams

    llm = LLM(**engine_kwargs, enable_prefix_caching=prefix_caching)
    try:
        vocab = llm.llm_engine.config.model.vocab_size
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
        warm = [[(7 * i + j) % (vocab - 3) + 3 for j in range(64)] for i in range(4)]
        llm.generate([{"prompt_token_ids": p} for p in warm], params, use_tqdm=False)
        before = llm.llm_engine.stats()
        _synchronize()
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        _synchronize()
        elapsed = time.perf_counter() - start
        after = llm.llm_engine.stats()
    finally:
        del llm
        release_device_memory()
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs if o.metrics]
    run = PrefixRun(
        prefix_caching=prefix_caching,
        num_requests=len(prompts),
        prompt_tokens=sum(len(p) for p in prompts),
        computed_prompt_tokens=after.num_computed_prompt_tokens - before.num_computed_prompt_tokens,
        prefix_cache_hit_rate=hits / queries if queries else 0.0,
        elapsed_s=elapsed,
        mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        output_tokens=sum(len(o.outputs[0].token_ids) for o in outs),
    )
    return run, [o.outputs[0].token_ids for o in outs]


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def format_report(off: PrefixRun, on: PrefixRun, same_tokens: bool) -> str:
    rows = [("prefix caching", "off", "on")]
    for label, get in [
        ("requests", lambda r: f"{r.num_requests}"),
        ("prompt tokens", lambda r: f"{r.prompt_tokens:,}"),
        ("prompt tokens computed", lambda r: f"{r.computed_prompt_tokens:,}"),
        ("cache hit rate", lambda r: f"{r.prefix_cache_hit_rate:.1%}"),
        ("generate time (s)", lambda r: f"{r.elapsed_s:.2f}"),
        ("mean TTFT (s)", lambda r: f"{r.mean_ttft_s:.3f}"),
        ("output tokens/s", lambda r: f"{r.output_tokens / r.elapsed_s:,.0f}"),
    ]:
        rows.append((label, get(off), get(on)))
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.rjust(width[i]) if i else cell.ljust(width[i]) for i, cell in enumerate(row)) for row in rows]
    saved = 1 - on.computed_prompt_tokens / off.computed_prompt_tokens if off.computed_prompt_tokens else 0.0
    lines.append(
        f"prefill work saved {saved:.1%}; time saved {1 - on.elapsed_s / off.elapsed_s:.1%} "
        f"({off.elapsed_s / on.elapsed_s:.2f}x faster); same tokens: {'yes' if same_tokens else 'NO'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint folder (default: the demo model)")
    p.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "pt", "dummy"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--system-len", type=int, default=1000, help="tokens of the shared system prompt")
    p.add_argument("--question-len", type=int, default=64, help="mean tokens of each request's own part")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, help="write both runs here")
    args = p.parse_args(argv)
    max_len = args.system_len + args.question_len * 3 // 2 + args.output_len
    engine_kwargs = dict(
        model=args.model, load_format=args.load_format, dtype=args.dtype, device=args.device,
        max_num_seqs=args.max_num_seqs, max_model_len=max(max_len, 256), enforce_eager=args.enforce_eager,
    )
    from folio.engine.arg_utils import EngineArgs

    vocab = EngineArgs.from_kwargs(**engine_kwargs).create_engine_config().model.vocab_size
    prompts = make_requests(args.num_prompts, args.system_len, args.question_len, min(vocab, 10001), args.seed)
    off, off_tokens = run_once(engine_kwargs, prompts, args.output_len, prefix_caching=False)
    on, on_tokens = run_once(engine_kwargs, prompts, args.output_len, prefix_caching=True)
    print(format_report(off, on, off_tokens == on_tokens))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"args": vars(args), "off": dataclasses.asdict(off), "on": dataclasses.asdict(on),
                       "same_tokens": off_tokens == on_tokens}, f, indent=2)
    return 0 if off_tokens == on_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
