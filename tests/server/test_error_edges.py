"""Edges of the 400/500 contract a fuzzing review found: a 500 that kept the connection alive,
bodies that are not JSON (or not UTF-8) told why, pydantic's wording cleaned up, and `param`
naming the field the client sent."""

from __future__ import annotations

import gzip
import http.client
import json
import logging

import httpx
import pytest

from tests.server.harness import api_error as _error

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hi"}]


def _text(records: list[logging.LogRecord]) -> str:
    return "\n".join(r.getMessage() for r in records)


# ---- an unexpected exception: a JSON 500, logged once, the connection kept ---------------------


def test_an_unexpected_error_is_a_500_and_keeps_the_connection(server, monkeypatch, captured):
    def broken():
        raise KeyError("injected")

    monkeypatch.setattr(server.app.state.serving.models, "list", broken)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("GET", "/v1/models")
        first = conn.getresponse()
        body = json.loads(first.read())
        assert first.status == 500 and body["error"]["type"] == "server_error"
        assert "KeyError" in body["error"]["message"] and "injected" in body["error"]["message"]
        monkeypatch.undo()
        sock = conn.sock
        conn.request("GET", "/v1/models")  # the same keep-alive connection: no reset
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["data"]
        assert conn.sock is sock
    finally:
        conn.close()
    logged = [r for r in captured if r.exc_info and "injected" in str(r.exc_info[1])]
    assert len(logged) == 1, _text(captured)  # once, with its traceback
    assert "Exception in ASGI application" not in _text(captured)


# ---- bodies that are not JSON ----------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(content=b'{"prompt": "a"}', headers={"content-type": "text/plain"}),
    dict(data={"prompt": "a"}),
    dict(files={"prompt": ("a.txt", b"a")}),
    dict(content=b'{"prompt": "a"}', headers={"content-type": ""}),
    dict(content=b"", headers={"content-type": "text/plain"}),
])
def test_a_body_not_sent_as_json_says_what_content_type_to_use(server, kwargs):
    error = _error(httpx.post(f"{server.base_url}/completions", **kwargs), 400)
    assert "Content-Type: application/json" in error["message"], error["message"]
    assert "dictionary" not in error["message"]


@pytest.mark.parametrize("content, headers, reason", [
    (b'{"prompt": "\xff\xfe a"}', {}, "not valid UTF-8"),
    ('{"prompt": "\u00e9"}'.encode("latin-1"), {"content-type": "application/json; charset=latin-1"}, "latin-1"),
    (gzip.compress(b'{"prompt": "a"}'), {"content-encoding": "gzip"}, "Content-Encoding gzip is not supported"),
    (b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}", {}, "integer literal too long"),
    (b"[" * 100_000 + b"]" * 100_000, {}, "nested too deeply"),
])
def test_a_body_that_cannot_be_parsed_says_why(server, content, headers, reason):
    headers = {"content-type": "application/json", **headers}
    error = _error(httpx.post(f"{server.base_url}/completions", content=content, headers=headers), 400)
    assert reason in error["message"], error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


# ---- messages: no pydantic prefix, one full stop ---------------------------------------------------


@pytest.mark.parametrize("path, body, param", [
    ("/completions", {"prompt": ""}, "prompt"),
    ("/completions", {"prompt": ["a", ""]}, "prompt"),
    ("/chat/completions", {"messages": MESSAGES, "store": True}, "store"),
])
def test_messages_have_no_value_error_prefix_nor_a_double_full_stop(server, path, body, param):
    error = _error(httpx.post(f"{server.base_url}{path}", json=body), 400)
    assert error["param"] == param
    assert "Value error" not in error["message"] and not error["message"].endswith(".."), error["message"]


# ---- param names the field the client sent ----------------------------------------------------------


@pytest.mark.parametrize("body, param, words", [
    ({}, None, "either prompt or messages"),
    ({"prompt": 5}, "prompt", "string"),
    ({"messages": "Hi"}, "messages", "list"),
])
def test_tokenize_errors_name_the_field_without_the_union_tag(server, body, param, words):
    error = _error(httpx.post(f"{server.url}/tokenize", json=body), 400)
    assert error["param"] == param and words in error["message"], error


LONG = "word " * 9000


@pytest.mark.parametrize("path, body, param", [
    ("/rerank", {"query": "a", "documents": ["a", "b", ""]}, "documents[2]"),
    ("/rerank", {"query": "a", "documents": ["a", "b", LONG]}, "documents[2]"),
    ("/rerank", {"query": LONG, "documents": ["a", "b"]}, "query"),
    ("/score", {"text_1": "a", "text_2": ["b", LONG]}, "text_2[1]"),
    ("/score", {"text_1": LONG, "text_2": ["b"]}, "text_1"),
    ("/score", {"text_1": ["", "a"], "text_2": ["b", "c"]}, "text_1[0]"),
    ("/score", {"text_1": "a", "text_2": ""}, "text_2"),
])
def test_score_and_rerank_errors_name_the_text(server, path, body, param):
    error = _error(httpx.post(f"{server.base_url}{path}", json=body, timeout=60), 400)
    assert error["param"] == param and param in error["message"], error


def test_a_long_text_past_a_cheap_bound_is_named_by_its_exact_length(server):
    # "a" tokens are short: the characters' lower bound lets the text through to tokenizing
    body = {"query": "a", "documents": ["b", "a " * 9000]}
    error = _error(httpx.post(f"{server.base_url}/rerank", json=body, timeout=60), 400)
    assert error["param"] == "documents[1]" and error["code"] == "context_length_exceeded", error


# ---- a refused request logs no ignored fields ---------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("tool_choice", [
    {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
    {"type": "function", "function": {"name": "not_a_tool"}, "extra": 1},
])
def test_a_refused_request_logs_no_ignored_fields(server, captured, tool_choice):
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 2}
    error = _error(httpx.post(f"{server.base_url}/chat/completions", json=body), 400)
    assert error["param"] == "tool_choice"
    assert "ignored" not in _text(captured)


def test_an_accepted_request_still_logs_its_ignored_fields(server, captured):
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 2, "brand_new": 1,
            "tool_choice": {"type": "function", "function": {"name": "f"}, "extra": 1}}
    assert httpx.post(f"{server.base_url}/chat/completions", json=body).status_code == 200
    text = _text(captured)
    assert "ignored: ['brand_new']" in text and "ignored: ['extra'] (in NamedToolChoice)" in text
    assert text.count("ignored") == 2, text


def test_a_tool_choice_of_another_type_is_refused_in_words(server):
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 2,
            "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}}
    error = _error(httpx.post(f"{server.base_url}/chat/completions", json=body), 400)
    assert error["param"] == "tool_choice"
    assert "tool_choice of type 'allowed_tools' is not supported" in error["message"], error
    assert "more problems" not in error["message"]
