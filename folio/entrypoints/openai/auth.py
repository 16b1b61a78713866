"""API keys: every route but the public ones needs `Authorization: Bearer <key>`.

The comparison is between SHA-256 digests with hmac.compare_digest, so its time depends
neither on where a wrong key differs nor on its length. A pure ASGI middleware (not
BaseHTTPMiddleware), so streaming responses and disconnect detection pass through untouched.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from folio.entrypoints.openai.errors import AuthenticationError

# Open without a key: probes, scrapers, and the API's own description.
PUBLIC_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect", "/redoc", "/dashboard"})
# The dashboard's static files hold no data: the page sends the key with each state read.
PUBLIC_PREFIXES = ("/dashboard/",)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("The API key must not be empty.")
        self.app = app
        self._digest = _digest(api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        if self.is_authorized(Headers(scope=scope).get("authorization", "")):
            await self.app(scope, receive, send)
            return
        error = AuthenticationError("Missing or incorrect API key: send it as 'Authorization: Bearer <key>'.")
        await error.response()(scope, receive, send)

    def is_authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            token = ""
        return hmac.compare_digest(_digest(token.strip()), self._digest)
