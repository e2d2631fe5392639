"""Guard: the checks every request passes before any route runs.

- Host header: a loopback name, the bound address or an allowed name. A web page the user opens
  can make the browser send requests to 127.0.0.1 under its own host name (DNS rebinding); the
  Host it sends then is that name, and is refused here.
- API key (when set): `Authorization: Bearer KEY` or `x-api-key: KEY` on /v1 routes and /metrics.
- Body size: refused at once from Content-Length, or as soon as a chunked body grows past it.
"""

from __future__ import annotations

import hmac

from engine.server.errors import APIError, error_response
from engine.server.settings import ServerSettings


class Guard:
    def __init__(self, app, settings: ServerSettings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        error = self._check(scope, headers)
        if error is not None:
            return await error_response(error, scope)(scope, receive, send)
        await self.app(scope, self._limited(receive), send)

    def _check(self, scope, headers: dict) -> APIError | None:
        s = self.settings
        host = headers.get("host")
        if host is not None and not s.host_allowed(host):
            return APIError(403, f"Host {host!r} is not allowed; start the server with --allowed-host "
                                 f"{host.split(':')[0]} to accept it", "permission", code="host_not_allowed")
        path = scope["path"]
        if s.api_key and scope["method"] != "OPTIONS" and (path.startswith("/v1/") or path == "/metrics"):
            if not self._key_ok(headers):
                return APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY' "
                                     "or 'x-api-key: KEY'", "authentication", code="invalid_api_key")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > s.max_body_bytes:
            return too_large(s.max_body_bytes)
        return None

    def _key_ok(self, headers: dict) -> bool:
        auth = headers.get("authorization", "")
        given = [headers.get("x-api-key", ""), auth[7:].strip() if auth[:7].lower() == "bearer " else ""]
        key = self.settings.api_key.encode()
        return any(g and hmac.compare_digest(g.encode(), key) for g in given)

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


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body exceeds {limit} bytes", "too_large", code="request_too_large")
