"""A lone UTF-16 surrogate ("\\ud800": JSON allows the escape, Unicode has no such character) in
any string of a request body is a 400 naming the field, on every endpoint (found by a fuzzing
review: it reached the tokenizer or the response encoder and gave a 500 with a traceback, or cut
a stream). A proper surrogate pair ("\\ud83d\\ude00", an emoji) is one character and is fine."""

from __future__ import annotations

import json

import httpx
import pytest

from folio.entrypoints.openai.errors import lone_surrogate_error, may_hold_lone_surrogate
from folio.entrypoints.openai.serving_responses import _EventWriter
from tests.server.harness import api_error

LONE = "\ud800"
EMOJI = "\U0001f600"  # json.dumps writes it as the pair "\ud83d\ude00"
USER = [{"role": "user", "content": "Hi"}]


def post(server, path: str, body, client: httpx.Client | None = None) -> httpx.Response:
    """POST the body as JSON with every non-ASCII character escaped (httpx cannot send a surrogate)."""
    content = body if isinstance(body, bytes) else json.dumps(body)
    return (client or httpx).post(f"{server.url}{path}", content=content,
                                  headers={"content-type": "application/json"}, timeout=60)


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}], "max_tokens": 2}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": [{"role": LONE, "content": "Hi"}], "max_tokens": 2}, "messages[0].role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" + LONE}]}],
                                  "max_tokens": 2}, "messages[0].content[0].text"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "structured_outputs": {"choice": ["x", LONE]}},
         "structured_outputs.choice[1]"),
        ("/v1/completions", {"prompt": LONE, "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": [[1, 2, 3], "ok", "b" + LONE], "max_tokens": 2}, "prompt[2]"),
        ("/tokenize", {"prompt": LONE}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
        ("/v1/score", {"text_1": LONE, "text_2": "b"}, "text_1"),
        ("/v1/rerank", {"query": "q", "documents": ["d", LONE]}, "documents[1]"),
        ("/v1/responses", {"input": LONE, "max_output_tokens": 2}, "input"),
        ("/v1/responses", {"input": "Hi", "instructions": LONE, "max_output_tokens": 2}, "instructions"),
        ("/v1/responses", {"input": "Hi", "user": LONE, "max_output_tokens": 2}, "user"),
        ("/v1/responses", {"input": "Hi", "metadata": {"a": LONE}, "max_output_tokens": 2}, "metadata.a"),
        ("/v1/responses", {"input": "Hi", "metadata": {"a": LONE}, "stream": True}, "metadata.a"),
        ("/v1/responses", {"input": "Hi", "metadata": {LONE: "a"}}, 'metadata["\\ud800"]'),
        ("/v1/embeddings", {"input": ["ok", LONE]}, "input[1]"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "unknown": {"deep": [{"x": "\udfff"}]}}, "unknown.deep[0].x"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    error = api_error(post(server, path, body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "not valid Unicode" in error["message"] and "surrogate" in error["message"]


def test_raw_surrogate_bytes_are_refused_too(server):
    # json.loads decodes bytes with "surrogatepass": ED A0 80 (not UTF-8) becomes "\ud800"
    body = b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80"}], "max_tokens": 2}'
    assert api_error(post(server, "/v1/chat/completions", body), 400)["param"] == "messages[0].content"


def test_a_surrogate_pair_is_one_character_and_is_accepted(server):
    assert "\\ud83d\\ude00" in json.dumps({"content": EMOJI})  # what is sent: the escaped pair
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi " + EMOJI}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    tokens = post(server, "/tokenize", {"prompt": EMOJI}).json()["tokens"]
    assert tokens == server.engine.tokenizer.encode(EMOJI)
    r = post(server, "/v1/responses", {"input": EMOJI, "metadata": {EMOJI: EMOJI}, "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["metadata"] == {EMOJI: EMOJI}
    # an escaped backslash before "ud800" is plain text, not a surrogate
    assert post(server, "/tokenize", {"prompt": "\\ud800"}).status_code == 200


def test_the_connection_stays_usable_after_the_400(server):
    with httpx.Client() as client:
        api_error(post(server, "/v1/responses", {"input": "Hi", "user": LONE}, client), 400)
        assert post(server, "/tokenize", {"prompt": "Hi"}, client).status_code == 200


def test_lone_surrogate_error_walks_any_depth_without_recursion():
    deep: object = LONE
    for _ in range(5000):
        deep = [deep]
    error = lone_surrogate_error({"a": deep})
    assert error is not None and error.param == "a" + "[0]" * 5000
    assert lone_surrogate_error({"prompt": list(range(100_000)), "x": [1.5, None, True], "e": EMOJI}) is None
    assert lone_surrogate_error(LONE).param is None
    assert lone_surrogate_error({"k y": {"\udc00": 1}}).param == '["k y"]["\\udc00"]'


def test_the_byte_scan_lets_ordinary_bodies_through():
    assert not may_hold_lone_surrogate(json.dumps({"prompt": "é ü \u00e9"}, ensure_ascii=False).encode())
    assert not may_hold_lone_surrogate(json.dumps({"prompt": "\u00e9"}).encode())  # "\u00e9"
    assert may_hold_lone_surrogate(json.dumps({"prompt": EMOJI}).encode())  # a pair: decoded and walked
    assert may_hold_lone_surrogate(json.dumps({"prompt": LONE}).encode("utf-16"))


def test_the_responses_event_writer_never_writes_text_utf8_cannot_encode():
    event = _EventWriter().write("response.created", response={"metadata": {"a": LONE}, "text": "é"})
    event.encode("utf-8")
    assert json.loads(event.split("data: ", 1)[1])["response"]["metadata"]["a"] == LONE
