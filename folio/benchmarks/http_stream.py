"""A lean HTTP/1.1 client for the serving benchmark: one POST a connection, its server-sent events.

`folio bench serve` puts hundreds of streamed requests on the wire at once and reads one event a
token; with httpx the client itself cost ~1 ms a request to start and ~30 us an event on the H100
host (docs/perf-notes.md, session 21), time the benchmark then charged to the server. This client
does only what the benchmark needs on asyncio's streams: a POST with a JSON body (`Connection:
close`), the status and headers, and a body that is chunked, sized or read to the end, split
into the `data:` payloads of its events. `--http-client httpx` keeps the old client for
comparison.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024


class HTTPStreamError(Exception):
    """The server broke the protocol, closed early, or could not be reached."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    tls: bool

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, parts.port or (443 if tls else 80), path, tls)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.tls else 80) else f"{host}:{self.port}"


class EventStream:
    """An answered POST: status, lower-cased headers, then its body once (events or whole)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int,
                 headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        self._reader, self._writer = reader, writer

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._writer.close()

    async def body(self) -> bytes:
        return b"".join([piece async for piece in self._pieces()])

    async def events(self) -> AsyncIterator[bytes]:
        """The data of each event (its `data:` lines joined by newlines), up to the body's end."""
        pending = b""
        async for piece in self._pieces():
            if b"\r" in piece:
                piece = piece.replace(b"\r\n", b"\n")
            pending += piece
            *complete, pending = pending.split(b"\n\n")
            for event in complete:
                data = _event_data(event)
                if data is not None:
                    yield data
        if pending.strip():
            data = _event_data(pending)
            if data is not None:
                yield data

    async def _pieces(self) -> AsyncIterator[bytes]:
        try:
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                async for piece in _chunked(self._reader):
                    yield piece
            elif "content-length" in self.headers:
                yield await self._reader.readexactly(int(self.headers["content-length"]))
            else:
                while piece := await self._reader.read(65536):
                    yield piece
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise HTTPStreamError(f"the response body ended early or is malformed: {type(e).__name__}: {e}") from None


def _event_data(event: bytes) -> bytes | None:
    lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


async def _chunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                pass
            return
        data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise ValueError("a chunk does not end in CRLF")
        yield data[:-2]


async def post_json(url: str, payload: dict[str, Any], *, connect_timeout_s: float = 30.0,
                    headers: dict[str, str] | None = None) -> EventStream:
    """Send one POST and read its status line and headers; the caller reads the body and closes."""
    target = Target.of(url)
    body = json.dumps(payload, separators=(",", ":")).encode()
    context = ssl.create_default_context() if target.tls else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(target.host, target.port, ssl=context, limit=MAX_HEAD_BYTES),
            connect_timeout_s)
    except (OSError, asyncio.TimeoutError) as e:
        raise HTTPStreamError(f"cannot connect to {target.host}:{target.port}: {type(e).__name__}: {e}") from None
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Accept: text/event-stream", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status, response_headers = await _read_head(reader)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        writer.close()
        raise HTTPStreamError(f"no valid response from {url}: {type(e).__name__}: {e}") from None
    return EventStream(reader, writer, status, response_headers)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    while True:  # 1xx answers (100 Continue) come before the real one
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        version, _, rest = head[0].partition(" ")
        if not version.startswith("HTTP/"):
            raise ValueError(f"not an HTTP status line: {head[0][:80]!r}")
        status = int(rest[:3])
        if status >= 200:
            break
    headers = {}
    for line in head[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers
