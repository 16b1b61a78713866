"""A headless Chromium driven over the DevTools protocol through --remote-debugging-pipe.

No websocket and no extra package: Chromium reads commands from fd 3 and writes answers and
events to fd 4, each one JSON message ended by a NUL byte. One page target is attached in flat
mode; every console error, uncaught exception and error log entry (a failed resource load) is
collected in `errors`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe", "--window-size=1280,1000", "--hide-scrollbars")


def find_browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class Chromium:
    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="folio-chromium-")
        to_browser, self._out = os.pipe()  # we write commands on _out; Chromium reads fd 3
        self._in, from_browser = os.pipe()  # Chromium writes fd 4; we read _in

        def child_fds() -> None:
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, pass_fds=(3, 4),
        )
        os.close(to_browser)
        os.close(from_browser)
        self._ids = iter(range(1, 1 << 30))
        self._answers: dict[int, dict] = {}
        self._events: list[dict] = []
        self._cond = threading.Condition()
        self.errors: list[str] = []
        threading.Thread(target=self._read, name="chromium-reader", daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    # ---- protocol -------------------------------------------------------------------------------
    def call(self, method: str, session: bool = False, **params: Any) -> dict:
        message_id = next(self._ids)
        message = {"id": message_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        with self._cond:
            if not self._cond.wait_for(lambda: message_id in self._answers, self.timeout_s):
                raise TimeoutError(f"Chromium did not answer {method}")
            answer = self._answers.pop(message_id)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                self._dispatch(json.loads(raw))

    def _dispatch(self, message: dict) -> None:
        with self._cond:
            if "id" in message:
                self._answers[message["id"]] = message
            else:
                self._events.append(message)
                self._note_error(message)
            self._cond.notify_all()

    def _note_error(self, event: dict) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"{params['entry'].get('url', '')}: {params['entry']['text']}")

    # ---- page -----------------------------------------------------------------------------------
    def navigate(self, url: str) -> None:
        with self._cond:
            self._events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_until(lambda: any(e.get("method") == "Page.loadEventFired" for e in self._events), "the page to load")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, condition, what: str, limit_s: float | None = None) -> None:
        deadline = time.monotonic() + (limit_s or self.timeout_s)
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}")
            time.sleep(0.05)

    def wait_for_js(self, expression: str, what: str, limit_s: float | None = None) -> None:
        self.wait_until(lambda: bool(self.evaluate(expression)), what, limit_s)

    def mouse_move(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)

    def screenshot(self, path: str) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, TimeoutError, RuntimeError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
