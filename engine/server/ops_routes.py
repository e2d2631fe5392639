"""GET /health (503 while the model loads, 200 once it serves) and GET /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from engine.server.http.sse import JSON

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    server = request.app.state.server
    if server.engine is not None:
        return JSON({"status": "ok", "model": server.settings.model_id})
    if server.load_error:
        return JSON({"status": "error", "error": server.load_error}, status_code=503)
    return JSON({"status": "loading"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request):
    server = request.app.state.server
    stats = server.engine.stats() if server.engine is not None else None
    return PlainTextResponse(server.metrics.render(stats), media_type="text/plain; version=0.0.4")
