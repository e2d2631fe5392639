"""create_app: the FastAPI application around an Engine (or one still loading)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.middleware.cors import CORSMiddleware

from engine.server import models_routes, ops_routes, tokenize_routes
from engine.server.anthropic import routes as anthropic_routes
from engine.server.openai import routes as openai_routes
from engine.server.responses import routes as responses_routes
from engine.server.http.body import with_request_schemas
from engine.server.http.errors import install_error_handlers
from engine.server.http.metrics import MetricsMiddleware
from engine.server.http.security import Guard
from engine.server.http.settings import ServerSettings
from engine.server.state import ServerState


def create_app(settings: ServerSettings | None = None, engine=None, *, params_hook=None) -> FastAPI:
    """`engine`: a running Engine, or None to attach one later with `app.state.server.set_engine`
    (until then /health answers 503 and the /v1 routes 503). `params_hook`: see ServerState."""
    settings = settings or ServerSettings()
    app = FastAPI(title="Qwen Desk local API", docs_url=None, redoc_url=None)
    app.state.server = ServerState(settings, engine, params_hook)
    for module in (openai_routes, responses_routes, anthropic_routes, models_routes, tokenize_routes, ops_routes):
        app.include_router(module.router)
    install_error_handlers(app)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]  # FastAPI's documented way to give the schema
    if settings.cors_origins:   # (an origin not listed never gets here: Guard refuses it)
        app.add_middleware(CORSMiddleware, allow_origins=settings.origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"])
    app.add_middleware(Guard, settings=settings)
    app.add_middleware(MetricsMiddleware, metrics=app.state.server.metrics)
    return app


def openapi(app: FastAPI) -> dict:
    """FastAPI's document, with the request bodies the routes read themselves and the errors they answer (built
    once)."""
    if app.openapi_schema is None:
        app.openapi_schema = with_error_responses(with_request_schemas(get_openapi(
            title=app.title, version=app.version, routes=app.routes)))
    return app.openapi_schema


ERRORS = {400: "the request is invalid (the message names the field)", 401: "the API key is missing or wrong",
          403: "the Host or Origin is not allowed", 404: "no such model or stored response",
          413: "the body is over the limit", 415: "the body is not JSON", 429: "the engine is busy: retry after",
          503: "the model is loading, or the server is busy preparing requests: retry after"}
OPENAI_ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}}}}
ANTHROPIC_ERROR = {"type": "object", "properties": {"type": {"const": "error"}, "error": {
    "type": "object", "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}


def with_error_responses(schema: dict) -> dict:
    """Each operation's error answers in its API's envelope (the Anthropic routes answer 529 where OpenAI's answer
    429), none of FastAPI's 422 (bodies are read by the routes: a bad one is a 400); /metrics is Prometheus text."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    components.update(OpenAIError=OPENAI_ERROR, AnthropicError=ANTHROPIC_ERROR)
    for path, item in schema.get("paths", {}).items():
        anthropic = path.startswith("/v1/messages")
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = [503] if path == "/health" else list(ERRORS) if method == "post" else [401, 403, 404, 503]
            for code in codes:
                status = 529 if anthropic and code == 429 else code
                ref = {"$ref": f"#/components/schemas/{'AnthropicError' if anthropic else 'OpenAIError'}"}
                responses[str(status)] = {"description": ERRORS[code], "content": {"application/json": {"schema": ref}}}
    metrics = schema["paths"].get("/metrics", {}).get("get")
    if metrics:
        metrics["responses"]["200"] = {"description": "Prometheus metrics",
                                       "content": {"text/plain": {"schema": {"type": "string"}}}}
    return schema
