"""The local endpoint's port: its default, decided here once (qwendesk-serve and the app), and the listening socket,
bound before anything slow starts, so that a port in use is one plain sentence at once."""

from __future__ import annotations

import errno
import socket
import sys

DEFAULT_PORT = 8080


class PortInUseError(OSError):
    """Another program listens on the address asked for."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) and listening (as uvicorn binds one); PortInUseError when another program holds
    the port, OSError for an address this machine does not have."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if sys.platform != "win32":         # as uvicorn: restart at once after a crash (a live listener still refuses)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
            raise PortInUseError(e.errno, f"port {port} on {host} is already in use by another program") from None
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock
