"""Cancel a handler when its client disconnects, so its engine requests are aborted at once.

Starlette cancels a *streaming* body when the client leaves, but a handler that is still
waiting (for a non-streaming result, or for its request to be accepted) would otherwise run
to the end. Watching `receive()` for http.disconnect while the handler runs closes that gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request
from starlette.responses import Response

T = TypeVar("T")

# Not an HTTP status anyone receives (the client is gone); nginx's name for it, for logs.
CLIENT_CLOSED_REQUEST = 499


async def cancel_on_disconnect(request: Request, handler: Awaitable[T]) -> T | Response:
    task = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read by now, so the next message is http.disconnect (uvicorn answers
    # it once the client goes away, or once the response is complete).
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
