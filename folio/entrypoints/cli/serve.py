"""`folio serve`: the OpenAI-compatible server (the demo model when no --model is given)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from folio.entrypoints.openai.cli_args import make_arg_parser

    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model)")
    make_arg_parser(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from folio.entrypoints.openai.api_server import run_server

    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"Two models given: {args.model_tag!r} and --model {args.model!r}.")
        args.model = args.model_tag
    return run_server(args)
