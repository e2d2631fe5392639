"""create_app: the FastAPI application around an Engine (or one still loading)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.middleware.cors import CORSMiddleware

from engine.server import anthropic_routes, models_routes, openai_routes, ops_routes, responses_routes
from engine.server.body import with_request_schemas
from engine.server.errors import install_error_handlers
from engine.server.metrics import MetricsMiddleware
from engine.server.security import Guard
from engine.server.settings import ServerSettings
from engine.server.state import ServerState


def create_app(settings: ServerSettings | None = None, engine=None, *, params_hook=None) -> FastAPI:
    """`engine`: a running Engine, or None to attach one later with `app.state.server.set_engine`
    (until then /health answers 503 and the /v1 routes 503). `params_hook`: see ServerState."""
    settings = settings or ServerSettings()
    app = FastAPI(title="Qwen Desk local API", docs_url=None, redoc_url=None)
    app.state.server = ServerState(settings, engine, params_hook)
    for module in (openai_routes, responses_routes, anthropic_routes, models_routes, ops_routes):
        app.include_router(module.router)
    install_error_handlers(app)
    app.openapi = lambda: openapi(app)
    if settings.cors_origins:   # (an origin not listed never gets here: Guard refuses it)
        app.add_middleware(CORSMiddleware, allow_origins=settings.origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"])
    app.add_middleware(Guard, settings=settings)
    app.add_middleware(MetricsMiddleware, metrics=app.state.server.metrics)
    return app


def openapi(app: FastAPI) -> dict:
    """FastAPI's document, with the request bodies the routes read themselves (built once)."""
    if app.openapi_schema is None:
        app.openapi_schema = with_request_schemas(get_openapi(title=app.title, version=app.version,
                                                              routes=app.routes))
    return app.openapi_schema
