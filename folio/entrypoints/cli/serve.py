"""`folio serve`: the OpenAI-compatible server (the demo model when no --model is given)."""

from __future__ import annotations

import argparse
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket

    from folio.entrypoints.openai.cli_args import ServerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    from folio.entrypoints.openai.cli_args import make_arg_parser

    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model)")
    make_arg_parser(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"Two models given: {args.model_tag!r} and --model {args.model!r}.")
        args.model = args.model_tag
    if args.tensor_parallel_size > 1:
        from folio.parallel.workers import exit_process_on_worker_death

        if _node_rank(args) > 0:  # another machine's ranks: no server, follow node 0
            return _serve_node(args)
        exit_process_on_worker_death()  # a server with a dead rank exits non-zero, at once
    # Until the server takes over the signals, SIGTERM must still stop the engine's process
    # (the default action would kill this one alone and orphan the child).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    core = config = sock = None
    try:
        if _engine_process_wanted(args):
            # The server's own flags and its port first: the engine's model may take minutes to
            # load, and a mistyped flag is to fail at once (on a thread, run_server checks them
            # before it builds the engine).
            config, sock = _check_server_args(args)
            core = start_engine_process(args)  # before the server's imports: the two load side by side
        from folio.entrypoints.openai.api_server import run_server

        if core is not None:
            core.wait_ready()
    except BaseException:
        if core is not None:
            core.close()
        if sock is not None:
            sock.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if core is None:
        return run_server(args)
    return run_server(args, core=core, config=config, sock=sock)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Stop the engine's process (started, or still starting) and exit now. Raising SystemExit
    instead could land inside an import or inside the child's start, and the interpreter's exit
    would then wait on threads or children that never end (seen once in CI: a 120 s hang)."""
    import multiprocessing
    import os

    for child in multiprocessing.active_children():
        child.terminate()
    os._exit(128 + signum)


def _engine_process_wanted(args: argparse.Namespace) -> bool:
    from folio.entrypoints.openai.cli_args import engine_process_wanted

    return engine_process_wanted(args.engine_process, args.device, args.tensor_parallel_size)


def _check_server_args(args: argparse.Namespace) -> tuple[ServerConfig, socket.socket]:
    """The server's flags checked (a ServerConfig) and its socket bound, with no engine yet."""
    from folio.entrypoints.openai.cli_args import bind_socket, check_server_args

    config = check_server_args(args)
    return config, bind_socket(config.host, config.port)


def start_engine_process(args: argparse.Namespace):
    """The engine's process, started now (it loads the model while the server's modules import)."""
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.engine_core import EngineProcess

    return EngineProcess.from_engine_args(EngineArgs.from_cli_args(args))


def _node_rank(args: argparse.Namespace) -> int:
    from folio.parallel.rendezvous import with_environment

    return with_environment(_engine_config(args).parallel).node_rank


def _engine_config(args: argparse.Namespace):  # noqa: ANN202
    from folio.engine.arg_utils import EngineArgs

    return EngineArgs.from_cli_args(args).create_engine_config()


def _serve_node(args: argparse.Namespace) -> int:
    """Nodes 1..nnodes-1 of a multi-node tensor-parallel engine (docs/tensor-parallel.md)."""
    from folio.parallel.launch import serve_node

    return serve_node(_engine_config(args))
