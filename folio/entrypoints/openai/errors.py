"""Errors at the HTTP edge: every failure leaves as `{"error": {message, type, param, code}}`.

Handlers raise an APIError subclass; `install_error_handlers` turns those, FastAPI's request
validation errors (400, never 422, a body not sent as JSON or not parsable told why),
Starlette's routing errors (404, 405) and anything unexpected (500, the connection kept) into
that one shape. `lone_surrogate_error` finds text that is not Unicode in a request body
(router.refuse_lone_surrogates runs it for every route).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from folio.engine.async_llm import EngineDeadError, QueueFullError
from folio.logger import init_logger

logger = init_logger(__name__)

# Seconds a client is told to wait when the waiting queue is full.
RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    status_code = 500
    type = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


class BadRequestError(APIError):
    status_code = 400
    type = "invalid_request_error"


class AuthenticationError(APIError):
    status_code = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


class NotFoundError(APIError):
    status_code = 404
    type = "invalid_request_error"


class MethodNotAllowedError(APIError):
    status_code = 405
    type = "invalid_request_error"


class InternalServerError(APIError):
    status_code = 500
    type = "server_error"


class ServiceUnavailableError(APIError):
    status_code = 503
    type = "server_error"


def model_not_found(name: str, served: str) -> NotFoundError:
    return NotFoundError(
        f"The model {name!r} does not exist; this server serves {served!r}.",
        param="model",
        code="model_not_found",
    )


def from_engine_error(error: BaseException) -> APIError:
    """The APIError for what AsyncLLM.add_request raised."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, QueueFullError):
        return ServiceUnavailableError(
            str(error), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    if isinstance(error, EngineDeadError):
        return ServiceUnavailableError(str(error), code="engine_unavailable")
    if isinstance(error, ValueError):  # LLMEngine.add_request refused the request
        return BadRequestError(str(error), param=getattr(error, "param", None))
    return internal_error(error)


def internal_error(error: BaseException) -> InternalServerError:
    logger.error("Request failed: %r", error, exc_info=error)
    return InternalServerError(f"Internal error while serving the request: {type(error).__name__}: {error}")


# ---- the handlers ---------------------------------------------------------------------------


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # Only for what escapes an outer middleware: Starlette's ServerErrorMiddleware answers with
    # it, then re-raises, and uvicorn closes the connection. Handlers' errors stop earlier:
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(UnexpectedErrorMiddleware)


class UnexpectedErrorMiddleware:
    """An exception from a route: the JSON 500, logged once (internal_error), and not re-raised,
    so the keep-alive connection survives (re-raised, uvicorn logs it again and closes it). Once
    the response has started, re-raised after all: only closing the connection tells the client
    its response is cut short."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as exc:
            if started:
                raise
            await internal_error(exc).response()(scope, receive, send)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if errors and tuple(errors[0].get("loc", ()))[:1] == ("body",):
        problem = _not_json_content_type(request.headers.get("content-type"))
        if problem is not None:  # FastAPI left the body unparsed: whatever pydantic says misleads
            return BadRequestError(problem).response()
    return validation_error(errors).response()


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        error: APIError = NotFoundError(f"No route {request.method} {request.url.path}.")
    elif exc.status_code == 405:
        error = MethodNotAllowedError(f"Method {request.method} is not allowed on {request.url.path}.")
    elif exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body
        error = BadRequestError(_unparsable_body(request, exc.__cause__))
    else:
        error = APIError(str(exc.detail))
        error.status_code = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return error.response()


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return internal_error(exc).response()


# ---- request bodies that are not JSON ---------------------------------------------------------

_SEND_JSON = "The request body must be JSON sent with Content-Type: application/json"


def _not_json_content_type(content_type: str | None) -> str | None:
    """Why FastAPI did not read the body as JSON (it reads application/json and */*+json only,
    and, as in vLLM, not a body without a content type); None when the type is JSON."""
    if not content_type:
        return f"{_SEND_JSON}; the request has no Content-Type."
    media = content_type.partition(";")[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    return f"{_SEND_JSON}, not {media}."


def _unparsable_body(request: Request, cause: BaseException) -> str:
    """The reason a JSON body failed to parse, where FastAPI says only "There was an error
    parsing the body": json.loads refused the bytes for something other than JSON syntax."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        return f"The request body is unreadable: Content-Encoding {encoding} is not supported; send it uncompressed."
    if isinstance(cause, UnicodeDecodeError):
        charset = _charset(request.headers.get("content-type", ""))
        told = f" (charset={charset} is not supported)" if charset not in (None, "utf-8", "utf8") else ""
        byte = cause.object[cause.start:cause.start + 1].hex()
        return f"The request body is not valid UTF-8{told}: byte 0x{byte} at position {cause.start}."
    if isinstance(cause, RecursionError):
        return "The request body is not valid JSON: it is nested too deeply."
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return "The request body is not valid JSON: an integer literal too long (more than 4300 digits)."
    return f"The request body could not be parsed: {type(cause).__name__}: {cause}".rstrip(": ") + "."


def _charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


# ---- validation errors --------------------------------------------------------------------------

# pydantic's prefixes of a validator's own words: the words are the message.
_PYDANTIC_PREFIXES = {"value_error": "Value error, ", "assertion_error": "Assertion failed, "}


def validation_error(errors: list[dict[str, Any]]) -> BadRequestError:
    """FastAPI/pydantic errors -> one 400 naming the first offending field."""
    if not errors:
        return BadRequestError("The request is invalid.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return BadRequestError(f"The request body is not valid JSON: {detail}".rstrip(": ") + ".")
    param = _param(first.get("loc", ()))
    message = _words(first)
    if param is None:
        return BadRequestError(f"The request body is invalid: {message}.")
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return BadRequestError(f"Invalid value for {param!r}: {message}.", param=param)


def _words(error: dict[str, Any]) -> str:
    """The error's message without pydantic's prefix or a closing full stop (the caller adds one)."""
    message = str(error.get("msg") or "Invalid value")
    prefix = _PYDANTIC_PREFIXES.get(error.get("type", ""), "")
    if prefix and message.startswith(prefix):
        message = message[len(prefix):]
    return message.rstrip(". ") or "Invalid value"


def _param(loc: Any) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; the body itself -> None.

    The path stops at a dict key or a union branch's type name ('list[int]', 'constrained-str'):
    those are not fields. A model's class name (a branch of a union of models) is skipped.
    """
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not isinstance(part, str) or not part.isidentifier() or part in _TYPE_NAMES:
            break
        elif part[0].isupper():
            continue
        else:
            text += f".{part}" if text else part
    return text or None


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def sse_error(error: APIError) -> str:
    """The server-sent event that reports an error after streaming began."""
    return f"data: {json.dumps(error.body())}\n\n"


# ---- text that is not Unicode -----------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
# What a lone surrogate in a decoded JSON body comes from: a \uD800-\uDFFF escape, or the raw
# bytes of one (ED A0-BF ..), which json.loads decodes with "surrogatepass". A proper pair of
# escapes ("\ud83d\ude00") decodes to one character and is fine, but matches too. (Two plain
# patterns scan several times faster than one with an alternation.)
_SURROGATE_SOURCES = (re.compile(rb"\\u[dD][89a-fA-F]"), re.compile(rb"\xed[\xa0-\xbf]"))
_NOT_TEXT = {int, float, bool, type(None)}


def has_lone_surrogate(text: str) -> bool:
    """Whether the text holds a UTF-16 surrogate, which UTF-8 cannot encode (isascii() is O(1))."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def may_hold_lone_surrogate(body: bytes) -> bool:
    """False when a JSON body surely decodes to no lone surrogate: one byte scan, no decoding."""
    if b"\x00" in body[:4] or body[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 or UTF-32: look after decoding
        return True
    return any(pattern.search(body) is not None for pattern in _SURROGATE_SOURCES)


def lone_surrogate_error(body: Any) -> BadRequestError | None:
    """The 400 for the first string of a decoded JSON body (a value or a key, at any depth) that
    holds a lone UTF-16 surrogate ("\\ud800": JSON allows the escape, Unicode has no such
    character, and the tokenizer and the response encoder fail on it); None when there is none.
    Without recursion; a path is only spelled out for the string it reports."""
    stack: list[tuple[Any, tuple | None]] = [(body, None)]  # (value, (parent's trail, key or index))
    while stack:
        node, trail = stack.pop()
        if isinstance(node, str):
            if has_lone_surrogate(node):
                return _not_unicode(trail, key=False)
        elif isinstance(node, dict):
            for key in node:
                if has_lone_surrogate(key):
                    return _not_unicode((trail, key), key=True)
            stack.extend((value, (trail, key)) for key, value in reversed(node.items())
                         if type(value) not in _NOT_TEXT)
        elif isinstance(node, list) and not _NOT_TEXT.issuperset(map(type, node)):  # token ids: skipped in C
            stack.extend((node[i], (trail, i)) for i in range(len(node) - 1, -1, -1)
                         if type(node[i]) not in _NOT_TEXT)
    return None


def _not_unicode(trail: tuple | None, key: bool) -> BadRequestError:
    """The 400 naming the string's path as _param spells paths ('messages[0].content')."""
    parts: list[Any] = []
    while trail is not None:
        trail, part = trail
        parts.append(part)
    param = ""
    for part in reversed(parts):
        if isinstance(part, int):
            param += f"[{part}]"
        elif part.isidentifier() and part.isascii():
            param += f".{part}" if param else part
        else:  # json.dumps escapes the surrogate: the message itself must stay encodable
            param += f"[{json.dumps(part)}]"
    problem = ("is not valid Unicode text: it holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape or "
               "character that is not half of a proper pair)")
    if not param:
        return BadRequestError(f"The request body {problem}.")
    label = "The field name" if key else "The value of"
    return BadRequestError(f"{label} {param!r} {problem}.", param=param)
