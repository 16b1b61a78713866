"""Command-line errors in one line: `folio serve: error: <message>` and where to look next.

argparse prints a parser's whole usage before its error; `folio serve` has ~90 flags, so the one
line that mattered came after ~87 lines of usage. Unknown flags get a word on what they are: a
vLLM flag folio does not support, or a near miss of one of folio's flags.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn

from folio.entrypoints.cli.vllm_flag_names import is_vllm_flag


class FolioArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2, as argparse's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.rstrip('.')}; see '{self.prog} --help'\n")


def unrecognized_message(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """What to say about arguments `parser` does not know: each flag, with what it is."""
    flags = [token for token in extras if token.startswith("-") and token != "-"]
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)}"
    return "; ".join(_describe(flag.split("=", 1)[0], parser) for flag in flags)


def _describe(flag: str, parser: argparse.ArgumentParser) -> str:
    if is_vllm_flag(flag):
        return f"{flag} is a vLLM flag that folio does not support (docs/vllm-compat.md lists the vLLM flags it takes)"
    known = [option for action in parser._actions for option in action.option_strings]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unrecognized arguments: {flag}{hint}"


def innermost_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser `argv` reaches: `folio bench throughput ...` -> its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for i, token in enumerate(argv):
                if token in action.choices:
                    return innermost_parser(action.choices[token], argv[i + 1:])
    return parser


def parse_or_exit(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, with unknown arguments reported by the subcommand that was given them."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        inner = innermost_parser(parser, argv)
        inner.error(unrecognized_message(extras, inner))
    return args
