"""The `folio` command: one subcommand per module in this package."""

from __future__ import annotations

import argparse
import sys

from folio.entrypoints.cli.arg_errors import FolioArgumentParser, parse_or_exit
from folio.version import __version__

# subcommand name -> module with register(subparsers) and run(args)
_SUBCOMMANDS = {
    "serve": "folio.entrypoints.cli.serve",
    "generate": "folio.entrypoints.cli.generate",
    "chat": "folio.entrypoints.cli.chat",
    "bench": "folio.entrypoints.cli.bench",
}


def build_parser() -> argparse.ArgumentParser:
    import importlib

    # Subcommands' parsers are made with the top parser's class: one-line errors everywhere.
    parser = FolioArgumentParser(prog="folio", description="folio: LLM inference and serving")
    parser.add_argument("--version", action="version", version=f"folio {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in _SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # not built yet
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_or_exit(parser, argv)
    if not getattr(args, "command", None):
        parser.print_help()
        sys.exit(2)
    try:
        code = args.run(args)
    except ValueError as e:  # bad configuration or input: a clear message, no traceback
        print(f"folio {args.command}: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)
