"""The engine's host cost per step, on the CPU, with the model replaced by a stub.

The GPU's time per step is fixed by the kernels; what the host spends around it (scheduling,
batch building, sampling metadata, stop checks, outputs) is what async scheduling must hide and
what this measures: LLMEngine.step on a tiny checkpoint whose forward and LM head return
precomputed tensors at once, so nearly all the time left is engine Python.

    PYTHONPATH=. python scripts/host_profile.py [--requests 256] [--steps 200] [--profile]
        [--output-kind final|cumulative] [--no-tokenizer] [--sync] [--vocab 151936]
        [--speculative-config '{"method": "ngram", "num_speculative_tokens": 6, "disable_by_batch_size": 1}']

Prints ms per decode step (steady state, every request decoding) and, with --profile, the
cProfile table of those steps.
"""

from __future__ import annotations

import argparse
import json
import cProfile
import pstats
import tempfile
import time

import torch

from folio import LLM, SamplingParams
from folio.sampling_params import RequestOutputKind
from tests.helpers.checkpoints import make_tiny_checkpoint
from tests.helpers.tokenizers import save_test_tokenizer


class StubModel:
    """Forward and LM head that cost nothing: zeros, then fixed logits per batch row."""

    def __init__(self, hidden: int, vocab: int, rows: int) -> None:
        self.hidden = hidden
        self.logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))

    def __call__(self, input_ids, positions, attn_metadata):
        return torch.zeros(input_ids.shape[0], self.hidden)

    def compute_logits(self, hidden):
        return self.logits[: hidden.shape[0]]


def _speculative_config(text: str | None, path: str) -> dict | None:
    """The --speculative-config JSON; "model": "SELF" drafts with the checkpoint itself."""
    if not text:
        return None
    config = json.loads(text)
    if config.get("model") == "SELF":
        config["model"] = path
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200, help="decode steps measured")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output-kind", default="final", choices=["final", "cumulative"])
    parser.add_argument("--no-tokenizer", action="store_true", help="token ids only, as W1 on dummy weights")
    parser.add_argument("--sync", action="store_true", help="--no-async-scheduling")
    parser.add_argument("--vocab", type=int, default=None,
                        help="a model and a synthetic byte-level tokenizer of this many tokens (151936: Qwen3's), "
                             "so sampled ids spread over a real-sized vocabulary")
    parser.add_argument("--speculative-config", default=None,
                        help='JSON, e.g. an n-gram paused by disable_by_batch_size: what a paused speculator costs the host '
                        '("model": "SELF": a draft model, the checkpoint itself)')
    parser.add_argument("--dump", default=None, help="with --profile: also write the cProfile stats here (pstats)")
    args = parser.parse_args()

    path = tempfile.mkdtemp(prefix="folio-host-")
    if args.vocab:
        from folio.benchmarks.bench_tokenizer import build_bench_tokenizer

        make_tiny_checkpoint("qwen3", path, vocab_size=args.vocab)
        if not args.no_tokenizer:
            build_bench_tokenizer(args.vocab).save_pretrained(path)
    else:
        make_tiny_checkpoint("qwen3", path)
        if not args.no_tokenizer:
            save_test_tokenizer(path)
    llm = LLM(model=path, dtype="float32", device="cpu", max_model_len=512, max_num_seqs=args.requests,
              async_scheduling=not args.sync,
              speculative_config=_speculative_config(args.speculative_config, path))
    engine = llm.llm_engine
    config = engine.config.model
    engine.runner.model = StubModel(config.hidden_size, config.vocab_size, args.requests)
    kind = RequestOutputKind.FINAL_ONLY if args.output_kind == "final" else RequestOutputKind.CUMULATIVE
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=min(args.steps + 50, 480), output_kind=kind)
    for i in range(args.requests):
        engine.add_request(str(i), {"prompt_token_ids": [3 + (i + j) % 90 for j in range(16)]}, params)
    for _ in range(10):  # prefill and the first decodes
        engine.step()
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(args.steps):
        engine.step()
    if profiler:
        profiler.disable()
    elapsed = time.perf_counter() - start
    print(f"{args.requests} requests, {args.steps} decode steps: {1e3 * elapsed / args.steps:.3f} ms per step "
          f"({1e6 * elapsed / args.steps / args.requests:.2f} us per request)")
    if profiler and args.dump:
        profiler.dump_stats(args.dump)
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
