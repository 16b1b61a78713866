"""The server's command line: its own flags plus every engine flag (EngineArgs)."""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
from dataclasses import dataclass, field

from folio.engine.arg_utils import EngineArgs
from folio.entrypoints.openai.frontend_args import FrontendConfig, add_frontend_args
from folio.logger import init_logger

logger = init_logger(__name__)

API_KEY_ENV = "FOLIO_API_KEY"
DEFAULT_MAX_WAITING_REQUESTS = 1024
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


@dataclass(frozen=True)
class LoRAModulePath:
    """One --lora-modules entry: `name=path` or vLLM's JSON `{"name", "path", "base_model_name"}`
    (base_model_name: the adapter's `parent` in /v1/models, as in vLLM; default the served model)."""

    name: str
    path: str
    base_model_name: str | None = None


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
    frontend: FrontendConfig = field(default_factory=FrontendConfig)  # vLLM's other server flags
    lora_modules: tuple[LoRAModulePath, ...] = ()  # adapters served from the start (--lora-modules)
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter, /v1/unload_lora_adapter
    dashboard: bool = True  # /dashboard and /v1/engine/state (docs/dashboard.md)
    # tool_choice "auto" reads tool calls with this parser (vLLM's flags: both needed).
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None  # fills reasoning_content from <think>...</think>

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}.")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ValueError(f"--max-waiting-requests must be at least 1, got {self.max_waiting_requests}.")
        # NaN passes a `< 0` test, and uvicorn's graceful shutdown fails on NaN or inf at SIGTERM.
        if not (math.isfinite(self.shutdown_timeout) and self.shutdown_timeout >= 0):
            raise ValueError(f"--shutdown-timeout must be a finite number of seconds >= 0, "
                             f"got {self.shutdown_timeout}.")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty: an empty key would turn authentication off.")
        names = [m.name for m in self.lora_modules]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"--lora-modules names {repeated[0]!r} more than once: adapter names must be unique.")
        self._check_parsers()

    def _check_parsers(self) -> None:
        from folio.entrypoints.openai.reasoning_parsers import REASONING_PARSERS
        from folio.entrypoints.openai.tool_parsers import TOOL_PARSERS

        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser.")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(sorted(TOOL_PARSERS))}, got {self.tool_call_parser!r}.")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser must be one of {', '.join(sorted(REASONING_PARSERS))}, got {self.reasoning_parser!r}.")
        if self.tool_call_parser is not None and not self.enable_auto_tool_choice:
            # The parser reads tool_choice "auto" only; "required" and a named function are
            # constrained decoding, which needs no parser. So without the flag it does nothing.
            logger.warning("--tool-call-parser %s is unused without --enable-auto-tool-choice: requests with "
                           'tool_choice "auto" get a 400 ("required" and named functions work without a parser).',
                           self.tool_call_parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerConfig:
        names = getattr(args, "served_model_name", None)  # vLLM's form: a list (of one name)
        if any(not name.strip() for name in ([names] if isinstance(names, str) else names or ())):
            # The engine would fall back to the model's path: a name nobody asked for.
            raise ValueError("--served-model-name must not be empty.")
        waiting = args.max_waiting_requests
        # An explicit --api-key "" is an error (__post_init__); only an empty $FOLIO_API_KEY means none.
        api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
        return cls(
            host=args.host,
            port=args.port,
            api_key=api_key,
            chat_template=args.chat_template,
            max_waiting_requests=None if waiting == 0 else waiting,
            shutdown_timeout=args.shutdown_timeout,
            log_level=args.uvicorn_log_level,
            access_log=not args.disable_uvicorn_access_log,
            engine_process=args.engine_process,
            frontend=FrontendConfig.from_cli_args(args),
            lora_modules=tuple(getattr(args, "lora_modules", None) or ()),
            allow_runtime_lora_updating=getattr(args, "allow_runtime_lora_updating", False),
            dashboard=getattr(args, "dashboard", True),
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
        )


def check_server_args(args: argparse.Namespace) -> ServerConfig:
    """The server's flags, checked as far as they go without an engine: before one is built
    (its model may take minutes to load), so a mistyped flag is one error line at once. The
    adapters of --lora-modules are loaded, and so checked, once the engine runs."""
    from folio.transformers_utils.chat_template import load_chat_template

    config = ServerConfig.from_cli_args(args)
    check_lora_flags(config, getattr(args, "enable_lora", False))
    if config.chat_template is not None:
        load_chat_template(config.chat_template)  # a file, or Jinja text; the app reads it again
    config.frontend.check_tls()
    return config


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a taken port fails at once; port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"Cannot listen on {host}:{port}: {e.strerror}.") from None
    sock.set_inheritable(True)
    return sock


def check_lora_flags(config: ServerConfig, lora_enabled: bool) -> None:
    """Flags that need an engine serving adapters: refused at startup, not answered with a 400 later."""
    if config.lora_modules and not lora_enabled:
        raise ValueError("--lora-modules needs --enable-lora.")
    if config.allow_runtime_lora_updating and not lora_enabled:
        raise ValueError("--allow-runtime-lora-updating needs --enable-lora.")


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
    g = parser.add_argument_group("Frontend")  # vLLM's name for the server's flags
    g.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=d.port, help="port to listen on (0: any free port, logged)")
    g.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}); /health, /ping, /version and /metrics stay open")
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
    add_frontend_args(g)
    g.add_argument("--lora-modules", nargs="+", type=parse_lora_module, default=None, metavar="NAME=PATH",
                   help="LoRA adapters to serve (needs --enable-lora): name=path, or vLLM's JSON "
                        "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; requests pick one by `model`")
    g.add_argument("--allow-runtime-lora-updating", action="store_true",
                   help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter (local paths)")
    g.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=d.dashboard,
                   help="serve the live engine view at /dashboard and /v1/engine/state (behind --api-key "
                        "when set; docs/dashboard.md)")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='answer tool_choice "auto" by parsing the model\'s own tool-call format (needs --tool-call-parser)')
    g.add_argument("--tool-call-parser", default=None, help="hermes, llama3_json or mistral")
    g.add_argument("--reasoning-parser", default=None, help="qwen3 or deepseek_r1: <think>...</think> becomes reasoning_content")
    EngineArgs.add_cli_args(parser)
    from folio.engine.vllm_cli import group_like_vllm

    group_like_vllm(parser)
    return parser


def parse_lora_module(text: str) -> LoRAModulePath:
    """One --lora-modules entry, `name=path` or a JSON object (argparse reports the error)."""
    if text.lstrip().startswith("{"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"invalid JSON in --lora-modules {text!r}: {e}") from None
        return _lora_module_from_json(text, fields)
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules entries are name=path, got {text!r}")
    return LoRAModulePath(name, path)


_LORA_JSON_KEYS = ("name", "path", "base_model_name")


def _lora_module_from_json(text: str, fields: object) -> LoRAModulePath:
    if not (isinstance(fields, dict) and isinstance(fields.get("name"), str) and isinstance(fields.get("path"), str)):
        raise argparse.ArgumentTypeError(f"--lora-modules JSON needs string 'name' and 'path', got {text!r}")
    if not fields["name"] or not fields["path"]:
        raise argparse.ArgumentTypeError(f"--lora-modules JSON needs a non-empty 'name' and 'path', got {text!r}")
    base = fields.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise argparse.ArgumentTypeError(f"--lora-modules 'base_model_name' must be a string, got {text!r}")
    unknown = sorted(set(fields) - set(_LORA_JSON_KEYS))
    if unknown:  # vLLM's keys only; anything else would be dropped without a word
        logger.warning("--lora-modules %s: ignoring unknown key(s) %s (known: %s).", fields["name"],
                       ", ".join(map(repr, unknown)), ", ".join(_LORA_JSON_KEYS))
    return LoRAModulePath(fields["name"], fields["path"], base)
