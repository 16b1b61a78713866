"""A tiny OpenAI-style completions server for the serving-benchmark tests (stdlib, any free port).

It streams one chunk per token of `max_tokens` and a final usage chunk, records every payload and
the most requests it ever had in flight, and answers 400 to prompts that start with FAIL_TOKEN.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAIL_TOKEN = 999


class StubState:
    def __init__(self, send_usage: bool = True, token_delay_s: float = 0.002) -> None:
        self.send_usage = send_usage
        self.token_delay_s = token_delay_s
        self.payloads: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()


def _handler(state: StubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._json(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})

        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.payloads.append(payload)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            self._counted = True
            try:
                if payload["prompt"][0] == FAIL_TOKEN:
                    self._json(400, {"error": {"message": "bad prompt", "type": "BadRequestError"}})
                else:
                    self._stream(payload)
            finally:
                self._finish()

        def _finish(self) -> None:
            """Out of flight before the response's last bytes go: once the client has them it may
            send its next request, which another thread could count before this one got here."""
            if getattr(self, "_counted", False):
                self._counted = False
                with state.lock:
                    state.in_flight -= 1

        def _stream(self, payload: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            n = payload["max_tokens"]
            for i in range(n):
                time.sleep(state.token_delay_s)
                self._event({"id": "cmpl-1", "object": "text_completion",
                             "choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}]})
            if state.send_usage:
                self._event({"id": "cmpl-1", "choices": [], "usage": {
                    "prompt_tokens": len(payload["prompt"]), "completion_tokens": n,
                    "total_tokens": len(payload["prompt"]) + n}})
            self._finish()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, data: dict[str, Any]) -> None:
            self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        def _json(self, code: int, data: dict[str, Any]) -> None:
            body = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._finish()
            self.wfile.write(body)

    return Handler


class StubServer:
    """`with StubServer() as s:` serves on s.base_url until the block ends."""

    def __init__(self, **state_kwargs: Any) -> None:
        self.state = StubState(**state_kwargs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
