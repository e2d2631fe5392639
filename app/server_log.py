"""The local endpoint's log, kept for Settings to show: the last lines of what its HTTP server (each
request, start-up, errors) and the engine's own loggers write, from whichever thread writes them."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

KEPT_LINES = 500
# uvicorn's request and server loggers, and the engine's (qwendesk.engine, qwendesk.server)
LOGGERS = ("uvicorn.access", "uvicorn.error", "qwendesk")


class ServerLog(logging.Handler):
    def __init__(self, kept: int = KEPT_LINES):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        self._lines: deque[str] = deque(maxlen=kept)
        self._lines_lock = threading.Lock()     # writers are any thread's loggers; the reader is Settings
        self.written = 0                 # lines ever written: the view redraws only when it grew

    def attach(self) -> None:
        """On the server's loggers (again after uvicorn configures them, which drops their handlers)."""
        for name in LOGGERS:
            logger = logging.getLogger(name)
            if self not in logger.handlers:
                logger.addHandler(self)

    def note(self, text: str) -> None:
        """A line of the app's own (the endpoint started, stopped, failed)."""
        self._add(f"{time.strftime('%H:%M:%S')} {text}")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._add(self.format(record))
        except Exception:  # noqa: BLE001 (a log line must never break the thread that writes it)
            self.handleError(record)

    def lines(self) -> list[str]:
        with self._lines_lock:
            return list(self._lines)

    def _add(self, line: str) -> None:
        with self._lines_lock:
            self._lines.append(line)
            self.written += 1
