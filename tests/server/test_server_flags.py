"""Server flags that used to be accepted and then ignored (or broke later): refused at startup
with a message naming the flag, or warned about when they are merely unused."""

from __future__ import annotations

import argparse
import logging

import pytest

from folio.entrypoints.openai.api_server import make_parser
from folio.entrypoints.openai.cli_args import ServerConfig, check_lora_flags, parse_lora_module
from folio.entrypoints.openai.frontend_args import FrontendConfig
from tests.helpers.logs import log_records


@pytest.fixture
def warnings_logged():
    """folio's warnings (its logger does not propagate to the root, where caplog listens)."""
    with log_records(logging.WARNING) as records:
        yield lambda: " | ".join(r.getMessage() for r in records)


def _config(*argv: str) -> ServerConfig:
    return ServerConfig.from_cli_args(make_parser().parse_args(["--device", "cpu", *argv]))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_shutdown_timeout_must_be_finite_and_non_negative(value):
    with pytest.raises(ValueError, match="--shutdown-timeout must be a finite number of seconds >= 0"):
        _config(f"--shutdown-timeout={value}")
    assert _config("--shutdown-timeout", "0").shutdown_timeout == 0.0


@pytest.mark.parametrize("argv, message", [
    (["--api-key", ""], "--api-key must not be empty"),
    (["--api-key", "  "], "--api-key must not be empty"),
    (["--served-model-name", ""], "--served-model-name must not be empty"),
    (["--ssl-ca-certs", __file__], "--ssl-ca-certs needs --ssl-keyfile and --ssl-certfile"),
])
def test_flags_that_would_be_dropped_are_refused(argv, message, monkeypatch):
    monkeypatch.setenv("FOLIO_API_KEY", "from-the-environment")  # an empty flag once fell back to it
    with pytest.raises(ValueError, match=message):
        _config(*argv)


def test_an_empty_api_key_variable_still_means_no_key(monkeypatch):
    monkeypatch.setenv("FOLIO_API_KEY", "")
    assert _config().api_key is None
    monkeypatch.setenv("FOLIO_API_KEY", "sk-env")
    assert _config().api_key == "sk-env" and _config("--api-key", "sk-flag").api_key == "sk-flag"


def test_lora_flags_need_enable_lora():
    with pytest.raises(ValueError, match="--allow-runtime-lora-updating needs --enable-lora"):
        check_lora_flags(ServerConfig(allow_runtime_lora_updating=True), lora_enabled=False)
    check_lora_flags(ServerConfig(allow_runtime_lora_updating=True), lora_enabled=True)


def test_unused_flags_are_warned_about(warnings_logged):
    _config("--tool-call-parser", "hermes")
    assert "--tool-call-parser hermes is unused without --enable-auto-tool-choice" in warnings_logged()
    _config("--max-log-len", "10")
    assert "--max-log-len is unused without --enable-log-requests" in warnings_logged()
    FrontendConfig(ssl_keyfile=__file__, ssl_certfile=__file__, ssl_ca_certs=__file__)
    assert "--ssl-ca-certs: client certificates are not requested" in warnings_logged()


def test_used_flags_are_not_warned_about(warnings_logged):
    _config("--tool-call-parser", "hermes", "--enable-auto-tool-choice")
    _config("--max-log-len", "10", "--enable-log-requests")
    FrontendConfig(ssl_keyfile=__file__, ssl_certfile=__file__)
    assert warnings_logged() == ""


def test_lora_modules_json_keeps_base_model_name_and_warns_on_unknown_keys(warnings_logged):
    module = parse_lora_module('{"name": "a", "path": "/p", "base_model_name": "b", "rank": 8}')
    assert (module.name, module.path, module.base_model_name) == ("a", "/p", "b")
    assert "--lora-modules a: ignoring unknown key(s) 'rank'" in warnings_logged()
    with pytest.raises(argparse.ArgumentTypeError, match="base_model_name"):
        parse_lora_module('{"name": "a", "path": "/p", "base_model_name": 3}')


def test_duplicate_lora_module_names_are_refused():
    with pytest.raises(ValueError, match="--lora-modules names 'a' more than once"):
        _config("--lora-modules", "a=/p", "b=/q", "a=/r")
    assert [m.name for m in _config("--lora-modules", "a=/p", "b=/q").lora_modules] == ["a", "b"]
