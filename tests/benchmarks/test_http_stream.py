"""http_stream, the serving benchmark's lean client, against a raw asyncio server that answers with
canned bytes: chunked, sized and close-delimited bodies, events split anywhere, CRLF events,
1xx answers, and the ways a server can break the protocol."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from folio.benchmarks.http_stream import HTTPStreamError, Target, post_json


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"


async def _exchange(answer: bytes, payload=None, path: str = "/v1/completions"):
    """Serve one connection with `answer`; return (the request's head and body, status, headers,
    the events or HTTPStreamError's message)."""
    seen = {}

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int([line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0]
                     .split(b":")[1])
        seen["head"], seen["body"] = head.decode(), json.loads(await reader.readexactly(length))
        for i in range(0, len(answer), 7):  # in small pieces: events and chunks split anywhere
            writer.write(answer[i:i + 7])
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        response = await post_json(f"http://127.0.0.1:{port}{path}", payload or {"prompt": [1, 2]},
                                   headers={"Authorization": "Bearer k"})
        async with response:
            try:
                got = [e async for e in response.events()]
            except HTTPStreamError as e:
                got = str(e)
        return seen, response.status, response.headers, got
    finally:
        server.close()
        await server.wait_closed()


def _run(answer: bytes, **kwargs):
    return asyncio.run(_exchange(answer, **kwargs))


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_events_and_the_request_sent():
    body = _chunked(b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\ndata: [DONE]\n\n')
    seen, status, headers, events = _run(HEAD_CHUNKED + body, payload={"prompt": [5, 6], "stream": True})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert events == [b'{"a": 1}', b'{"b": 2}', b"[DONE]"]
    assert seen["body"] == {"prompt": [5, 6], "stream": True}
    lines = seen["head"].split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1"
    assert "Connection: close" in lines and "Authorization: Bearer k" in lines
    assert any(line.startswith("Host: 127.0.0.1:") for line in lines)


def test_close_delimited_body_crlf_events_comments_and_multiline_data():
    answer = (b"HTTP/1.0 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\n"
              b": a comment\r\n\r\ndata: one\r\ndata:two\r\n\r\nevent: x\ndata: 3\n\ndata: tail")
    _, status, _, events = _run(answer)
    assert status == 200 and events == [b"one\ntwo", b"3", b"tail"]  # a last event without its blank line


def test_sized_error_body():
    async def main():
        seen = {}

        async def handle(reader, writer):
            seen["head"] = await reader.readuntil(b"\r\n\r\n")
            writer.write(b'HTTP/1.1 400 Bad Request\r\nContent-Length: 16\r\n\r\n{"error": "bad"}')
            await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, await post_json(f"http://127.0.0.1:{port}/x?y=1", {}) as response:
            assert response.status == 400
            assert await response.body() == b'{"error": "bad"}'
        assert seen["head"].startswith(b"POST /x?y=1 HTTP/1.1\r\n")

    asyncio.run(main())


@pytest.mark.parametrize("answer, problem", [
    (HEAD_CHUNKED + b"10\r\ndata: cut", "ended early"),  # the server closed inside a chunk
    (HEAD_CHUNKED + b"zz\r\n", "malformed"),  # not a chunk size
    (HEAD_CHUNKED + b"2\r\nabXY", "malformed"),  # a chunk without its CRLF
    (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\ndata: 1\n\n", "ended early"),
])
def test_broken_bodies_raise_clearly(answer, problem):
    assert problem in _run(answer)[3]


def test_unreachable_server_and_bad_status_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    with pytest.raises(HTTPStreamError, match="cannot connect"):
        asyncio.run(post_json(f"http://127.0.0.1:{port}/", {}))
    with pytest.raises(HTTPStreamError, match="not an HTTP status line"):
        _run(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_targets():
    assert Target.of("http://h:8000/v1/completions") == Target("h", 8000, "/v1/completions", False)
    assert Target.of("https://h/v1").port == 443 and Target.of("https://h/v1").host_header == "h"
    assert Target.of("http://[::1]:81/").host_header == "[::1]:81"
    with pytest.raises(ValueError, match="not an http"):
        Target.of("ftp://h/")


def test_a_silent_server_times_the_request_out_into_its_trace():
    """send_request bounds the lean client's whole request by timeout_s: the trace says so."""
    from folio.benchmarks.serve_client import send_request
    from folio.benchmarks.workloads import BenchRequest

    async def main():
        async def handle(reader, writer):
            await reader.read(1)  # takes the request in, never answers
            await asyncio.sleep(5)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await send_request(None, f"http://127.0.0.1:{port}/v1/completions", "m", BenchRequest([1, 2], 3),
                                      timeout_s=0.2)

    trace = asyncio.run(main())
    assert not trace.success and trace.error == "no end of the stream within 0.2 s"


def test_a_connection_reset_mid_body_is_a_stream_error():
    async def main():
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(HEAD_CHUNKED + b"8\r\ndata: 1\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.transport.abort()  # a reset, not an orderly close

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, await post_json(f"http://127.0.0.1:{port}/", {}) as response:
            return [e async for e in response.events()]

    with pytest.raises(HTTPStreamError, match="ended early or is malformed"):
        asyncio.run(main())
