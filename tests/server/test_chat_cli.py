"""`folio chat`: a piped conversation against the running server, and against a local model."""

from __future__ import annotations

import io
import sys

import pytest

from folio.entrypoints.cli.main import main

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hello"}]


def _chat(argv: list[str], stdin: str, monkeypatch, capsys) -> tuple[str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as e:
        main(["chat", *argv])
    assert e.value.code == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _reply(client, model_name, messages) -> str:
    r = client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0)
    return r.choices[0].message.content


def test_chat_against_a_server_keeps_the_conversation(server, client, model_name, monkeypatch, capsys):
    first = _reply(client, model_name, MESSAGES)
    second = _reply(client, model_name, [*MESSAGES, {"role": "assistant", "content": first},
                                         {"role": "user", "content": "More"}])
    out, _ = _chat(["--url", server.url, "--temperature", "0", "--max-tokens", "8"],
                   "Hello\nMore\n/reset\nHello\n/exit\nignored\n", monkeypatch, capsys)
    assert out == f"{first}\n{second}\n{first}\n"


def test_chat_reports_server_errors_and_goes_on(server, client, model_name, monkeypatch, capsys):
    out, err = _chat(["--url", server.base_url, "--temperature", "0", "--max-tokens", "300"],
                     "Hello\n", monkeypatch, capsys)
    assert "[error] 400" in err and "maximum context length" in err


def test_chat_with_a_local_model(checkpoint, client, model_name, monkeypatch, capsys):
    expected = _reply(client, model_name, MESSAGES)
    out, _ = _chat(["--model", checkpoint, "--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                    "--temperature", "0", "--max-tokens", "8"], "Hello\n", monkeypatch, capsys)
    assert out == f"{expected}\n"


def test_chat_says_when_no_server_answers(monkeypatch, capsys):
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n"))
    with pytest.raises(SystemExit) as e:
        main(["chat", "--url", f"http://127.0.0.1:{port}"])
    assert e.value.code == 2 and "cannot reach a server" in capsys.readouterr().err
