"""ServerThread: uvicorn serving an app from a background thread (the desktop app, tests)."""

from __future__ import annotations

import threading
import time

from engine.api import DEFAULT_PORT
from engine.server.connections import LimitedServer, uvicorn_config


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = DEFAULT_PORT, log_level: str = "warning"):
        """port 0 picks a free port; `port` holds the real one once started. The connection limits are those of
        the app's ServerSettings."""
        self.server = LimitedServer(uvicorn_config(app, app.state.server.settings, host, port, log_level))
        self.workers = app.state.server.workers
        self.host, self.port = host, port
        self.thread = threading.Thread(target=self.server.run, name="qwendesk-http", daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.workers.pool.shutdown(wait=False, cancel_futures=True)     # (the app may start another endpoint)
