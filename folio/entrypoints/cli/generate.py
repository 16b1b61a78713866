"""`folio generate`: run prompts through the offline engine and print the completions."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from folio.engine.arg_utils import EngineArgs

    p = subparsers.add_parser("generate", help="generate completions for prompts, offline")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    p.add_argument("--prompts-file", default=None, help="a file with one prompt per line")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    p.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    EngineArgs.add_cli_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from folio import LLM, SamplingParams
    from folio.engine.arg_utils import EngineArgs

    prompts = list(args.prompt or [])
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts-file")
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        n=args.n,
        seed=args.sampling_seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )
    engine_args = EngineArgs.from_cli_args(args)
    llm = LLM(**vars(engine_args))
    for output in llm.generate(prompts, params, use_tqdm=sys.stderr.isatty()):
        if args.json:
            print(json.dumps({
                "prompt": output.prompt,
                "outputs": [
                    {"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                    for c in output.outputs
                ],
            }))
            continue
        for completion in output.outputs:
            print(f"{output.prompt!r} -> {completion.text!r}  [{completion.finish_reason}]")
    return 0
