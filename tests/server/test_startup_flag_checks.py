"""A mistyped server flag fails before any engine exists: one error line, exit status 2.

`folio serve` used to start the engine's process (which loads the model: minutes on a big one)
before the server checked its own flags (a chat template, --lora-modules, TLS files, an empty
--api-key, ...), so a typo was reported only once the model had loaded. Here the engine's
process, and the threaded engine, fail the test if they are ever started.
"""

from __future__ import annotations

import socket

import pytest

from folio.engine.async_llm import AsyncLLM
from folio.engine.engine_core import EngineProcess
from folio.entrypoints.cli import serve
from folio.entrypoints.cli.main import main
from folio.entrypoints.openai import api_server
from folio.entrypoints.openai.cli_args import ServerConfig

# --engine-process without --device auto: no GPU probe, and the path that starts the process.
PROCESS = ["--device", "cpu", "--engine-process", "--port", "0"]


def _never(what: str):
    def fail(*args, **kwargs):
        raise AssertionError(f"{what} was started for a command with a bad flag")

    return fail


@pytest.fixture
def no_engine(monkeypatch):
    monkeypatch.delenv("FOLIO_API_KEY", raising=False)
    monkeypatch.setattr(serve, "start_engine_process", _never("the engine's process"))
    monkeypatch.setattr(EngineProcess, "__init__", _never("the engine's process"))
    monkeypatch.setattr(AsyncLLM, "from_engine_args", _never("the engine"))


def _not_pem(tmp_path) -> str:
    path = tmp_path / "not-a-key.pem"
    path.write_text("not a PEM file\n")
    return str(path)


def _taken_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _error_line(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


# (flags, the whole error line after "folio serve: error: "); a trailing "..." matches any rest.
CASES = {
    "chat-template": (["--chat-template", "/nope.jinja"],
                      "Chat template '/nope.jinja' is neither an existing file nor Jinja template text."),
    "lora-without-enable-lora": (["--lora-modules", "a=/tmp"], "--lora-modules needs --enable-lora."),
    "runtime-lora-without-enable-lora": (["--allow-runtime-lora-updating"],
                                         "--allow-runtime-lora-updating needs --enable-lora."),
    "duplicate-lora-names": (["--enable-lora", "--lora-modules", "a=/x", "a=/y"],
                             "--lora-modules names 'a' more than once: adapter names must be unique."),
    "ssl-not-a-file": (["--ssl-keyfile", "/nope.key", "--ssl-certfile", "/nope.crt"],
                       "--ssl-keyfile '/nope.key' is not a file."),
    "ssl-alone": (["--ssl-certfile", __file__], "--ssl-keyfile and --ssl-certfile go together: pass both or neither."),
    "empty-api-key": (["--api-key", ""], "--api-key must not be empty: an empty key would turn authentication off."),
    "empty-served-model-name": (["--served-model-name", ""], "--served-model-name must not be empty."),
    "shutdown-timeout": (["--shutdown-timeout", "nan"],
                         "--shutdown-timeout must be a finite number of seconds >= 0, got nan."),
    "port": (["--port", "70000"], "--port must be in [0, 65535], got 70000."),
    "max-waiting-requests": (["--max-waiting-requests", "-1"], "--max-waiting-requests must be at least 1, got -1."),
    "tool-choice-without-parser": (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser."),
    "max-log-len": (["--max-log-len", "-1"], "--max-log-len must be non-negative, got -1."),
    "response-role": (["--response-role", "user"], "--response-role 'user': folio answers as 'assistant' only."),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_frontend_flag_fails_before_the_engine_process_starts(case, no_engine, capsys):
    flags, expected = CASES[case]
    assert _error_line(["serve", *PROCESS, *flags], capsys) == f"folio serve: error: {expected}"


def test_a_tls_key_that_is_not_pem_fails_before_the_engine_process_starts(tmp_path, no_engine, capsys):
    flags = ["--ssl-keyfile", _not_pem(tmp_path), "--ssl-certfile", _not_pem(tmp_path)]
    line = _error_line(["serve", *PROCESS, *flags], capsys)
    assert line.startswith("folio serve: error: --ssl-keyfile/--ssl-certfile: cannot load the TLS key and "
                           "certificate: "), line


def test_a_taken_port_fails_before_the_engine_process_starts(no_engine, capsys):
    with _taken_port() as taken:
        port = taken.getsockname()[1]
        line = _error_line(["serve", "--device", "cpu", "--engine-process", "--port", str(port)], capsys)
    assert line.startswith(f"folio serve: error: Cannot listen on 127.0.0.1:{port}: "), line


def test_a_malformed_lora_module_is_a_parse_error(no_engine, capsys):
    line = _error_line(["serve", *PROCESS, "--lora-modules", "a"], capsys)
    assert line.startswith("folio serve: error: argument --lora-modules: --lora-modules entries are name=path"), line


@pytest.mark.parametrize("entry", ["serve", "api_server"])
def test_on_a_thread_the_engine_is_not_built_either(entry, no_engine, capsys):
    """--no-engine-process (and `python -m folio.entrypoints.openai.api_server`): run_server
    checks the flags before it builds the engine; the message is the same."""
    flags = ["--device", "cpu", "--no-engine-process", "--port", "0", "--chat-template", "/nope.jinja"]
    expected = "Chat template '/nope.jinja' is neither an existing file nor Jinja template text."
    if entry == "serve":
        assert _error_line(["serve", *flags], capsys) == f"folio serve: error: {expected}"
    else:
        assert api_server.main(flags) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"folio serve: error: {expected}"


class _FakeCore:
    def __init__(self, log: list) -> None:
        self.log = log

    def wait_ready(self) -> _FakeCore:
        self.log.append("ready")
        return self

    def close(self) -> None:
        self.log.append("close")


def test_good_flags_reach_the_server_checked_and_with_the_socket_bound(monkeypatch):
    """The engine's process starts after the checks; run_server gets the checked config and the
    socket bound for it (and checks nothing twice); the engine is left to it, not closed."""
    monkeypatch.delenv("FOLIO_API_KEY", raising=False)
    log: list = []

    def start(args):
        log.append("start")
        return _FakeCore(log)

    def run_server(args, core=None, *, config=None, sock=None):
        log.append("run")
        with sock:
            assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
            assert config == ServerConfig.from_cli_args(args) and config.frontend.root_path == "/api"
            assert isinstance(core, _FakeCore)
        return 0

    monkeypatch.setattr(serve, "start_engine_process", start)
    monkeypatch.setattr(api_server, "run_server", run_server)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *PROCESS, "--root-path", "/api"])
    assert exit_.value.code == 0
    assert log == ["start", "ready", "run"]


def test_without_an_engine_process_run_server_is_called_as_before(monkeypatch):
    calls = []
    monkeypatch.setattr(serve, "start_engine_process", _never("the engine's process"))
    monkeypatch.setattr(api_server, "run_server", lambda *args, **kwargs: calls.append((args, kwargs)) or 0)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--device", "cpu", "--no-engine-process", "--chat-template", "/nope.jinja"])
    assert exit_.value.code == 0  # run_server (here a stub) is what checks the flags on this path
    ((args,), kwargs), = calls
    assert kwargs == {} and args.chat_template == "/nope.jinja"
