"""Errors in each API's own envelope.

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"}}

Routes raise APIError with a neutral kind; the envelope (and for an overloaded engine the status:
429 on OpenAI routes, 529 on Anthropic routes) follows from the route the request was for.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException

from engine.api import ContextLengthError, QueueFullError
from engine.server.http.sse import JSON

log = logging.getLogger("qwendesk.server")

# kind -> (OpenAI type, Anthropic type)
KINDS = {
    "invalid_request": ("invalid_request_error", "invalid_request_error"),
    "authentication": ("invalid_request_error", "authentication_error"),
    "permission": ("permission_error", "permission_error"),
    "not_found": ("invalid_request_error", "not_found_error"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "overloaded": ("rate_limit_error", "overloaded_error"),
    "unavailable": ("server_error", "api_error"),
    "server": ("server_error", "api_error"),
}
STATUS_KINDS = {400: "invalid_request", 401: "authentication", 403: "permission", 404: "not_found",
                405: "invalid_request", 413: "too_large", 415: "invalid_request", 503: "unavailable"}


class APIError(HTTPException):
    """An HTTPException, so that FastAPI passes it through untouched even from body parsing."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request", *, param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(status, message, headers or {})
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code


class ClientGone(Exception):
    """The client went away before a reply that is not streamed was ready. Nobody reads the answer: it
    is a 499 (nginx's "client closed request") in the log and the metrics, never a 5xx."""


def overloaded(message: str) -> APIError:
    return APIError(429, message, "overloaded", code="server_overloaded", headers={"retry-after": "1"})


def from_engine_error(e: Exception) -> APIError:
    """What Engine.submit raises, as the error a client gets."""
    if isinstance(e, QueueFullError):
        return overloaded(str(e))
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), param="messages", code="context_length_exceeded")
    if isinstance(e, ValueError):
        return APIError(400, str(e))
    if isinstance(e, RuntimeError):       # the engine is closed (shutting down)
        return APIError(503, str(e), "unavailable")
    raise e


def flavor(scope) -> str:
    """'anthropic' for the Messages routes (and /v1/models asked by an Anthropic client), else 'openai'."""
    path = scope.get("path", "")
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/models"):
        return "anthropic" if any(k == b"anthropic-version" for k, _ in scope.get("headers", ())) else "openai"
    return "openai"


def error_payload(err: APIError, api: str) -> tuple[int, dict]:
    openai_type, anthropic_type = KINDS.get(err.kind, KINDS["server"])
    if api == "anthropic":
        status = 529 if err.kind == "overloaded" else err.status
        return status, {"type": "error", "error": {"type": anthropic_type, "message": err.message}}
    return err.status, {"error": {"message": err.message, "type": openai_type, "param": err.param, "code": err.code}}


def error_response(err: APIError, scope) -> JSON:
    status, body = error_payload(err, flavor(scope))
    return JSON(body, status_code=status, headers=err.headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return error_response(exc, request.scope)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return Response(status_code=499)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = STATUS_KINDS.get(exc.status_code, "server" if exc.status_code >= 500 else "invalid_request")
        return error_response(APIError(exc.status_code, str(exc.detail), kind), request.scope)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server"), request.scope)


def validation_error(errors) -> APIError:
    """pydantic's list of errors -> one 400 naming the first bad field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_type_tag(p)]
    param = ".".join(loc) or None
    where = f"{param}: " if param else ""
    if first.get("type") == "missing":
        return APIError(400, f"{param} is required" if param else "the request body is missing", param=param)
    return APIError(400, f"{where}{first.get('msg', 'invalid value')}", param=param)


def _is_type_tag(part) -> bool:
    """pydantic names the member of a union it tried ('str', 'list[ContentPart]'): not a field."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "dict", "list"))
