"""The live dashboard: `/dashboard` (a static page shipped in static/) over `/v1/engine/state`.

`install_dashboard(app, engine)` adds the routes of routes.py, a StateFeed for the SSE stream
and turns the engine's per-second history on; `folio serve --no-dashboard` skips all three.
docs/dashboard.md documents the state's schema (static/engine_state.schema.json).
"""

from __future__ import annotations

from fastapi import FastAPI

from folio.engine.async_llm import AsyncLLM
from folio.entrypoints.openai.dashboard.routes import router
from folio.entrypoints.openai.dashboard.state_feed import StateFeed


def install_dashboard(app: FastAPI, engine: AsyncLLM) -> None:
    engine.enable_state_history()
    app.state.state_feed = StateFeed(engine)
    app.include_router(router)
