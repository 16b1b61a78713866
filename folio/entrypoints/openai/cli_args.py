"""The server's command line: its own flags plus every engine flag (EngineArgs)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from folio.engine.arg_utils import EngineArgs

API_KEY_ENV = "FOLIO_API_KEY"
DEFAULT_MAX_WAITING_REQUESTS = 1024
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    chat_template: str | None = None
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING_REQUESTS
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    log_level: str = "info"
    access_log: bool = True
    engine_process: bool | None = None  # None: a process when the engine runs on CUDA

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}.")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ValueError(f"--max-waiting-requests must be at least 1, got {self.max_waiting_requests}.")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be non-negative, got {self.shutdown_timeout}.")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerConfig:
        waiting = args.max_waiting_requests
        return cls(
            host=args.host,
            port=args.port,
            api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
            chat_template=args.chat_template,
            max_waiting_requests=None if waiting == 0 else waiting,
            shutdown_timeout=args.shutdown_timeout,
            log_level=args.uvicorn_log_level,
            access_log=not args.disable_uvicorn_access_log,
            engine_process=args.engine_process,
        )


def engine_process_wanted(flag: bool | None, device: str, tensor_parallel_size: int = 1) -> bool:
    """--engine-process, or when unset: a process on a GPU (a GPU engine steps fast enough for
    the event loop's HTTP work to starve it of a shared GIL; docs/serving.md), a thread on the CPU.
    Tensor parallelism: a thread (the server's process is rank 0 and exits when a worker dies)."""
    if tensor_parallel_size > 1:
        if flag:
            raise ValueError("--engine-process does not combine with --tensor-parallel-size > 1 yet: "
                             "the server's process is rank 0 of the tensor-parallel group.")
        return False
    if flag is not None:
        return flag
    from folio.config.device import resolve_device

    return resolve_device(device) == "cuda"


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    d = ServerConfig()
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=d.port, help="port to listen on (0: any free port, logged)")
    g.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}); /health and /metrics stay open")
    g.add_argument("--chat-template", default=None,
                   help="chat template file or Jinja text (default: the checkpoint's)")
    g.add_argument("--max-waiting-requests", type=int, default=d.max_waiting_requests,
                   help="answer 503 + Retry-After while this many sequences wait to be scheduled (0: no limit)")
    g.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout,
                   help="seconds in-flight requests get to finish after SIGTERM before they are aborted")
    g.add_argument("--uvicorn-log-level", default=d.log_level,
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="no line per HTTP request")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=d.engine_process,
                   help="run the engine in a process of its own (its own GIL; a crash there leaves "
                        "the server answering 503) instead of on a thread of the server process "
                        "(default: a process on a GPU, a thread on the CPU; docs/serving.md)")
    EngineArgs.add_cli_args(parser)
    return parser
