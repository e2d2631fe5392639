"""Request preparation off the event loop: body parsing, chat templates, tokenizing, image decoding and schema checks
run on a small pool of threads of its own. Its queue is bounded: a request that finds it full is refused at once
(503 with retry-after), so heavy requests cannot pile up without end, and the event loop (every stream, /health) never
waits for them. The tokenizer releases the GIL while it works (engine/text/tokenizer.py), so one 30 MB prompt being
tokenized leaves the loop free."""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor

from engine.server.http.errors import APIError


class Workers:
    def __init__(self, threads: int = 2, max_waiting: int = 32):
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="qwendesk-prepare")
        self.capacity = threads + max_waiting
        self.busy = 0                   # jobs queued or running, counted until each ends (its client may be gone)
        self._lock = threading.Lock()

    async def run(self, fn, *args, timeout: float | None = None, abandoned=None, **kwargs):
        """fn(*args, **kwargs) on a worker. `timeout`: asyncio.TimeoutError past it (the worker goes on); what fn
        returns after its caller stopped waiting (timed out, or cancelled: the client left) goes to `abandoned`."""
        with self._lock:
            if self.busy >= self.capacity:
                raise APIError(503, f"the server is preparing {self.busy} requests already; retry shortly",
                               "unavailable", code="server_busy", headers={"retry-after": "1"})
            self.busy += 1
        future = self.pool.submit(functools.partial(fn, *args, **kwargs))
        future.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            if abandoned is not None:
                future.add_done_callback(lambda f: f.cancelled() or f.exception() or abandoned(f.result()))
            raise

    def _done(self, _future) -> None:
        with self._lock:
            self.busy -= 1
