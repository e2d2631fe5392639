"""ServerThread: uvicorn serving an app from a background thread (the desktop app, tests)."""

from __future__ import annotations

import threading
import time

from engine.api import DEFAULT_PORT, listen_socket
from engine.server.http.connections import LimitedServer, uvicorn_config


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = DEFAULT_PORT, log_level: str = "warning"):
        """Binds at once (engine.api.listen_socket: a port in use raises PortInUseError, an OSError, saying so); port
        0 picks a free port, and `port` is the real one. The connection limits are those of the app's
        ServerSettings."""
        self.server = LimitedServer(uvicorn_config(app, app.state.server.settings, host, port, log_level))
        self.workers = app.state.server.workers
        self.socket = listen_socket(host, port)
        self.host, self.port = host, self.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="qwendesk-http", daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self.socket.close()
                raise RuntimeError(f"the HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()
        self.workers.pool.shutdown(wait=False, cancel_futures=True)     # (the app may start another endpoint)
