"""Connection limits in front of the HTTP parser: whatever runs before the API key check is bounded in time and memory.

The key is checked once a request's headers have arrived (security.Guard), so anyone who can reach the port can
open sockets and send headers slowly. Here, per connection, before any route:
- a cap on open connections in all (never more than a quarter of the process's file-descriptor limit) and per
  client address: a connection over either is answered 503 and closed at once, before a byte of it is read
  (asyncio accepts up to `backlog` sockets per turn of its loop, two or three turns before a refusal closes them:
  the backlog is a sixteenth of the limit, so that a flood stays within it);
- the request line and headers must arrive within `header_timeout_s` (else 408 and closed) and within
  `max_header_bytes` (else 431 and closed);
- a request body that stops arriving for `body_timeout_s` (a client trickling a body it announced) is cut: 408 and
  closed;
- a kept-alive connection with no request in progress is closed after `idle_timeout_s`;
- WebSocket upgrades are not served (no route uses them).
Under file-descriptor pressure (EMFILE on accept) and from clients sending garbage, the log gets one line a
minute per kind of trouble, never a traceback per socket.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import sys
import time
from collections import Counter
from http import HTTPStatus

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.server.http.settings import ServerSettings

log = logging.getLogger("qwendesk.connections")
READ_CHUNK = 256 * 1024             # the most asyncio reads from a socket at once
FD_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# uvicorn's warnings per request about a malformed one, or a WebSocket upgrade (not served here)
NOISY_MESSAGES = ("Invalid HTTP request received.", "Unsupported upgrade request.", "No supported WebSocket library")


class RateLimitedLog:
    """At most one line per `every_s` seconds for one kind of trouble, with how often it happened meanwhile."""

    def __init__(self, what: str, every_s: float = 60.0):
        self.what, self.every_s = what, every_s
        self.count, self.last = 0, float("-inf")

    def note(self, detail: str = "") -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            log.warning("%s%s (%d since the last such line; at most one a minute)", self.what,
                        f": {detail}" if detail else "", self.count)
            self.count, self.last = 0, now


class Connections:
    """The open connections, in all and per client address, shared by the server's protocol instances."""

    def __init__(self, settings: ServerSettings):
        self.max_total = min(settings.max_connections, fd_limit() // 4)
        self.max_per_client = settings.max_connections_per_client
        self.total = 0
        self.per_client: Counter[str] = Counter()
        self.refused = RateLimitedLog("connections refused over the cap")
        self.timed_out = RateLimitedLog("connections closed for sending their headers or body too slowly")
        self.too_large = RateLimitedLog("requests refused for headers too large")

    def admit(self, client: str) -> bool:
        if self.total >= self.max_total or self.per_client[client] >= self.max_per_client:
            self.refused.note(f"{self.total} open, {self.per_client[client]} from {client}")
            return False
        self.total += 1
        self.per_client[client] += 1
        return True

    def release(self, client: str) -> None:
        self.total -= 1
        self.per_client[client] -= 1
        if not self.per_client[client]:
            del self.per_client[client]


def fd_limit() -> int:
    if sys.platform == "win32":         # no file-descriptor limit of this kind
        return 1 << 20
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def protocol_class(settings: ServerSettings) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the limits above; one Connections per server."""
    connections = Connections(settings)

    class LimitedProtocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.address = self.client[0] if self.client else ""
            self.admitted = connections.admit(self.address)
            self.header_timer: asyncio.TimerHandle | None = None
            self.body_timer: asyncio.TimerHandle | None = None
            self.header_bytes = 0
            if not self.admitted:
                self.refuse(503, "the server has too many open connections; retry later", retry_after=True)
                return
            self.wait_for_headers()

        def connection_lost(self, exc) -> None:
            if self.admitted:
                connections.release(self.address)
                self.admitted = False
            self.stop_header_timer()
            self.stop_body_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self.admitted or self.transport.is_closing():
                return
            reading_headers = self.conn.their_state is h11.IDLE
            if reading_headers:
                self.header_bytes += len(data)
                if self.header_timer is None:       # a kept-alive connection's next request starts
                    self.wait_for_headers()
            super().data_received(data)
            self.watch_body()
            if not reading_headers or self.transport.is_closing():
                return
            if self.conn.their_state is not h11.IDLE:            # the headers are in
                self.stop_header_timer()
                self.header_bytes = 0
            elif self.header_bytes > settings.max_header_bytes:
                connections.too_large.note(self.address)
                self.refuse(431, f"the request line and headers exceed {settings.max_header_bytes} bytes")

        def watch_body(self) -> None:
            """While a body is coming, it must not stop for body_timeout_s."""
            self.stop_body_timer()
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.body_timer = self.loop.call_later(settings.body_timeout_s, self.body_too_slow)

        def stop_body_timer(self) -> None:
            if self.body_timer is not None:
                self.body_timer.cancel()
                self.body_timer = None

        def body_too_slow(self) -> None:
            self.body_timer = None
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                connections.timed_out.note(self.address)
                self.refuse(408, f"the request's body stopped arriving for {settings.body_timeout_s:g} s")

        def wait_for_headers(self) -> None:
            self.header_timer = self.loop.call_later(settings.header_timeout_s, self.headers_too_slow)

        def stop_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def headers_too_slow(self) -> None:
            self.header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                connections.timed_out.note(self.address)
                self.refuse(408, f"the request's headers did not arrive within {settings.header_timeout_s:g} s")

        def refuse(self, status: int, message: str, retry_after: bool = False) -> None:
            """Answer with an error (OpenAI's envelope) and close, the parser bypassed."""
            self.stop_header_timer()
            self.stop_body_timer()
            self._unset_keepalive_if_required()
            kind = "server_error" if status >= 500 else "invalid_request_error"
            body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
            head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
                    f"content-length: {len(body)}", "connection: close"] + (["retry-after: 1"] if retry_after else [])
            self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            self.transport.close()

    return LimitedProtocol


class LimitedServer(uvicorn.Server):
    """uvicorn's server with a quiet event loop: out-of-descriptor errors on accept (asyncio logs each with a
    traceback) become one line a minute."""

    async def startup(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(quiet_handler())
        await super().startup(sockets)


def quiet_handler():
    fd_pressure = RateLimitedLog("out of file descriptors (the connection cap leaves too few for this process)")

    def handle(loop, context: dict) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in FD_ERRORS:
            fd_pressure.note(str(exc))
            return
        loop.default_exception_handler(context)

    return handle


class QuietFilter(logging.Filter):
    """uvicorn's warnings per malformed request, one line a minute."""

    def __init__(self):
        super().__init__()
        self.logs = {m: RateLimitedLog(f"bad requests refused: {m}") for m in NOISY_MESSAGES}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        limited = next((log for start, log in self.logs.items() if message.startswith(start)), None)
        if limited is None:
            return True
        limited.note()
        return False


def uvicorn_config(app, settings: ServerSettings, host: str, port: int, log_level: str) -> uvicorn.Config:
    """The uvicorn configuration of the endpoint, with the connection limits of `settings`."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", ws="none",
                          http=protocol_class(settings),
                          # uvicorn annotates an int; it hands the value to loop.call_later, which takes seconds
                          timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]
                          h11_max_incomplete_event_size=settings.max_header_bytes + READ_CHUNK + 1,
                          timeout_graceful_shutdown=5, backlog=max(16, min(2048, fd_limit() // 16)))
    error_log = logging.getLogger("uvicorn.error")       # (after Config: it configures uvicorn's loggers)
    if not any(isinstance(f, QuietFilter) for f in error_log.filters):
        error_log.addFilter(QuietFilter())
    return config
