"""The dashboard's HTTP routes: the engine state (JSON, or server-sent events) and the page.

The page and its files are public (they hold no data; auth.py lets `/dashboard` through): the
page asks for the API key, when the server has one, and sends it with every state read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response
from starlette.responses import StreamingResponse

from folio.entrypoints.openai.errors import NotFoundError, ServiceUnavailableError
from folio.entrypoints.openai.protocol import ErrorResponse

STATIC_DIR = Path(__file__).parent / "static"
_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".json": "application/json", ".png": "image/png"}
_FILE_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9]+)+$")  # no separators, no dot-dot

router = APIRouter()

_BLOCKS = Query(False, description="add the block map: one state per KV block, each request's block ids")
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (400, 401, 503)}


def _engine(request: Request):
    engine = request.app.state.serving.engine
    if not engine.is_running:
        raise ServiceUnavailableError(str(engine.dead_error or "The engine is not running."),
                                      code="engine_unavailable")
    return engine


@router.get("/v1/engine/state", responses={200: {"description": "The engine state (docs/dashboard.md)"}, **_ERRORS})
async def engine_state(request: Request, blocks: bool = _BLOCKS) -> Response:
    """The scheduler's queues, KV cache usage, counters and per-second series, read between two steps."""
    state = await _engine(request).engine_state(with_blocks=blocks)
    return Response(json.dumps(state, separators=(",", ":"), allow_nan=False), media_type="application/json")


@router.get("/v1/engine/state/stream", responses={
    200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
          "description": "One `data: <engine state>` event about 4 times a second"}, **_ERRORS})
async def engine_state_stream(request: Request, blocks: bool = _BLOCKS) -> StreamingResponse:
    """The engine state as server-sent events while the client listens (shared reads, ~4/s)."""
    _engine(request)
    return StreamingResponse(request.app.state.state_feed.events(blocks), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> FileResponse:
    return _static("index.html")


@router.get("/dashboard/{name}", include_in_schema=False)
async def dashboard_file(name: str) -> FileResponse:
    return _static(name)


def _static(name: str) -> FileResponse:
    path = STATIC_DIR / name
    media_type = _MEDIA_TYPES.get(path.suffix)
    if not _FILE_NAME.match(name) or media_type is None or not path.is_file():
        raise NotFoundError(f"No dashboard file {name!r}.")
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": "no-cache"})
