"""Guard: the checks every request passes before any route runs (nothing is parsed or queued first).

The server is reachable by any web page the user opens, so it assumes the browser is hostile:
- Host header: a loopback name, the bound address or an allowed name. A page can make the browser
  send requests to 127.0.0.1 under its own host name (DNS rebinding); the Host it sends then is that
  name, and is refused here.
- Origin: a browser names the page's origin on every cross-origin request (and on every POST). One not
  listed with --cors-origin is refused (403), preflights included, so a page's "simple" POST (which
  the browser sends without asking first) never reaches a route. Clients that are not browsers send no
  Origin.
- Content-Type: a POST body must be `application/json` (a `charset`, if given, utf-8), else 415: the
  other types (text/plain, form encodings) are the ones a page may send without a preflight.
- API key (when set): `Authorization: Bearer KEY` or `x-api-key: KEY` on every path but /health (a
  check on path prefixes could be dodged with "//v1/..." or a trailing slash).
- Body size: refused at once from Content-Length, or as soon as a chunked body grows past it.
"""

from __future__ import annotations

import hmac

from engine.server.http.errors import APIError, error_response
from engine.server.http.settings import ServerSettings

OPEN_PATHS = ("/health",)           # no key needed: supervisors probe it


class Guard:
    def __init__(self, app, settings: ServerSettings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[str, list[str]] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.decode("latin-1").lower(), []).append(v.decode("latin-1"))
        error = self._check(scope, headers)
        if error is not None:
            return await error_response(error, scope)(scope, receive, send)
        await self.app(scope, self._limited(receive), send)

    def _check(self, scope, headers: dict[str, list[str]]) -> APIError | None:
        s = self.settings
        for host in headers.get("host", []):
            if not s.host_allowed(host):
                return APIError(403, f"Host {host!r} is not allowed; start the server with --allowed-host "
                                     f"{host.split(':')[0]} to accept it", "permission", code="host_not_allowed")
        for origin in headers.get("origin", []):
            if not s.origin_allowed(origin):
                return APIError(403, f"requests from the web origin {origin!r} are not allowed; start the server "
                                     f"with --cors-origin {origin} to accept them", "permission",
                                code="origin_not_allowed")
        method, path = scope["method"], scope["path"]
        if s.api_key and method != "OPTIONS" and path not in OPEN_PATHS and not key_ok(headers, s.api_key):
            return APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY' "
                                 "or 'x-api-key: KEY'", "authentication", code="invalid_api_key")
        if method == "POST":
            error = content_type_error(headers.get("content-type", []))
            if error is not None:
                return error
        length = headers.get("content-length", [""])[-1]
        if length.isdigit() and int(length) > s.max_body_bytes:
            return too_large(s.max_body_bytes)
        return None

    def _limited(self, receive):
        limit, seen = self.settings.max_body_bytes, 0

        async def receive_limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit)
            return message

        return receive_limited


def content_type_error(values: list[str]) -> APIError | None:
    """None when the one Content-Type given is JSON in UTF-8 ("application/json; charset=utf-8")."""
    if len(values) != 1:
        given = "no Content-Type" if not values else "several Content-Type headers"
        return unsupported_media(f"the request has {given}")
    media, *params = [p.strip().lower() for p in values[0].split(";")]
    if media != "application/json":
        return unsupported_media(f"Content-Type {values[0]!r} is not accepted")
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "charset" and value.strip().strip('"') not in ("utf-8", "utf8"):
            return unsupported_media(f"Content-Type {values[0]!r} is not accepted (JSON is UTF-8)")
    return None


def unsupported_media(why: str) -> APIError:
    return APIError(415, f"{why}; send the body as JSON with 'Content-Type: application/json'",
                    code="unsupported_media_type")


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body exceeds {limit} bytes", "too_large", code="request_too_large")


def key_ok(headers: dict[str, list[str]], api_key: str) -> bool:
    """The request carries the API key (x-api-key, or authorization: Bearer)."""
    given = list(headers.get("x-api-key", []))
    given += [a[7:].strip() for a in headers.get("authorization", []) if a[:7].lower() == "bearer "]
    key = api_key.encode()
    return any(g and hmac.compare_digest(g.encode(), key) for g in given)
