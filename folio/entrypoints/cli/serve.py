"""`folio serve`: the OpenAI-compatible server (the demo model when no --model is given)."""

from __future__ import annotations

import argparse
import signal


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
    core = None
    try:
        core = start_engine_process(args)  # before the server's imports: the two load side by side
        from folio.entrypoints.openai.api_server import run_server

        if core is not None:
            core.wait_ready()
    except BaseException:
        if core is not None:
            core.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return run_server(args, core=core)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Stop the engine's process (started, or still starting) and exit now. Raising SystemExit
    instead could land inside an import or inside the child's start, and the interpreter's exit
    would then wait on threads or children that never end (seen once in CI: a 120 s hang)."""
    import multiprocessing
    import os

    for child in multiprocessing.active_children():
        child.terminate()
    os._exit(128 + signum)


def start_engine_process(args: argparse.Namespace):
    """The engine's process, started now, when the engine is to run in one (else None)."""
    from folio.engine.arg_utils import EngineArgs
    from folio.engine.engine_core import EngineProcess
    from folio.entrypoints.openai.cli_args import engine_process_wanted

    if not engine_process_wanted(args.engine_process, args.device, args.tensor_parallel_size):
        return None
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
