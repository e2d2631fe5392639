"""Plain HTTP connections (http.client) that honour the environment's proxy settings and can be
cut from another thread: how the downloader and the remote chat client stop at once."""

from __future__ import annotations

import http.client
import socket
import urllib.request
from urllib.parse import SplitResult, urlsplit


def open_connection(parts: SplitResult, timeout: float) -> http.client.HTTPConnection:
    """A connection to the URL's host, or through the proxy the environment names (an https URL
    tunnels through it; an http URL is then requested by its full address)."""
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(p.hostname or "", p.port or 3128, timeout=timeout)
            conn.set_tunnel(host, port)
            return conn
        return http.client.HTTPConnection(p.hostname or "", p.port or 3128, timeout=timeout)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(host, port, timeout=timeout)


def request_target(conn: http.client.HTTPConnection, url: str) -> str:
    """What goes on the request line: the path, or the whole URL when talking to an http proxy."""
    parts = urlsplit(url)
    if parts.scheme == "http" and conn.host != parts.hostname:
        return url
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def abort_connection(conn: http.client.HTTPConnection) -> None:
    """End a read blocked on this connection (any thread)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
