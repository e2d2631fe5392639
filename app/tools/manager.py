"""ToolServers: the MCP client. Each configured server is started when a chat first needs its tools, on one asyncio
loop that runs on a thread of its own; the GUI asks through methods that return concurrent futures.

A server that dies (its process ends, its connection breaks, it fails to start) is marked failed with the reason and
its stderr's last line; the next use starts it again. A call has a time-out and its output a size cap. close() stops
every server (a stdio server's process tree is terminated by the SDK: stdin closed, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED

from app.paths import data_dir
from app.tools.config import ServerConfig

log = logging.getLogger("qwendesk.app")

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0
MAX_OUTPUT_CHARS = 20_000       # of a result's text the model reads
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 8 << 20


@dataclass
class ToolInfo:
    server: str
    name: str                   # the tool's name on its server (and as the model calls it)
    description: str
    parameters: dict            # its JSON schema

    def schema(self) -> dict:
        """The tool as the engine takes it (OpenAI-style)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class ToolResult:
    status: str                 # ok | error (the tool's or the server's) | timeout | denied
    text: str = ""
    images: list[tuple[str, bytes]] = field(default_factory=list)     # (mime type, data)
    seconds: float = 0.0


@dataclass
class ServerStatus:
    state: str                  # stopped | starting | ready | failed
    message: str = ""
    tools: list[ToolInfo] = field(default_factory=list)


class _Connection:
    """One running server: the task that holds its transport and session open until `stopping` is set."""

    def __init__(self, config: ServerConfig, log_path: Path):
        self.config, self.log_path = config, log_path
        self.session: ClientSession | None = None
        self.tools: list[ToolInfo] = []
        self.stopping = asyncio.Event()
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            with open(self.log_path, "w", encoding="utf-8") as errlog:
                async with AsyncExitStack() as stack:
                    streams = await stack.enter_async_context(self._transport(errlog))
                    self.session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                    await asyncio.wait_for(self.session.initialize(), START_TIMEOUT_S)
                    listed = await asyncio.wait_for(self.session.list_tools(), START_TIMEOUT_S)
                    self.tools = [ToolInfo(self.config.name, t.name, t.description or "", dict(t.input_schema))
                                  for t in listed.tools]
                    self.ready.set_result(self.tools)
                    await self.stopping.wait()
        except BaseException as e:      # noqa: BLE001 - anyio wraps failures in groups: all of them end the server
            if not self.ready.done():
                self.ready.set_exception(RuntimeError(self.reason(e)))
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.session = None

    def _transport(self, errlog):
        c = self.config
        if c.url:
            return streamable_http_client(c.url, http_client=create_mcp_http_client(headers=c.headers or None))
        command, args = c.launch()
        return stdio_client(StdioServerParameters(command=command, args=args, env=c.env or None), errlog=errlog)

    def reason(self, error: BaseException) -> str:
        """Why the server failed, in one line: the innermost error, and the last line it wrote to stderr."""
        group = getattr(error, "exceptions", None)        # an exception group (BaseExceptionGroup: Python 3.11+)
        while group:
            error = group[0]
            group = getattr(error, "exceptions", None)
        text = str(error) or type(error).__name__
        if isinstance(error, TimeoutError):
            text = f"it did not answer within {START_TIMEOUT_S:.0f} s"
        last = self.stderr_tail()
        return text + (f" (it said: {last})" if last else "")

    def stderr_tail(self) -> str:
        try:
            lines = [l.strip() for l in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
        except OSError:
            return ""
        lines = [l for l in lines if l]
        return lines[-1][:300] if lines else ""


class ToolServers:
    """The app's tool servers. `on_status(name, ServerStatus)` is called from the loop's thread when a server's state
    changes."""

    def __init__(self, on_status: Callable[[str, ServerStatus], None] = lambda name, status: None,
                 call_timeout_s: float = CALL_TIMEOUT_S):
        self.on_status, self.call_timeout_s = on_status, call_timeout_s
        self._configs: dict[str, ServerConfig] = {}
        self._connections: dict[str, _Connection] = {}
        self._statuses: dict[str, ServerStatus] = {}
        self._logs = data_dir() / "tool-servers"
        self._logs.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tool-servers", daemon=True)
        self._thread.start()
        self._closed = False

    # ---- any thread --------------------------------------------------------------------------
    def configure(self, servers: list[ServerConfig]) -> None:
        """The servers there are now; a running one whose configuration changed (or that is gone) stops."""
        self._submit(self._configure(copy.deepcopy(list(servers)))).result()     # later edits are not its own

    def status(self, name: str) -> ServerStatus:
        return self._statuses.get(name, ServerStatus("stopped"))

    def tools(self, names: list[str]) -> concurrent.futures.Future:
        """-> {name: list[ToolInfo] | str (why the server could not start)}, starting the servers that are not."""
        return self._submit(self._tools(list(names)))

    def call(self, server: str, tool: str, arguments: dict,
             timeout_s: float | None = None) -> concurrent.futures.Future:
        """-> ToolResult (never raises: a failure is a result with status error or timeout)."""
        return self._submit(self._call(server, tool, arguments, timeout_s or self.call_timeout_s))

    def stop(self, name: str) -> None:
        self._submit(self._stop(name)).result()

    def close(self) -> None:
        """Stop every server and the loop; waits until their processes are gone."""
        if self._closed:
            return
        self._closed = True
        try:
            self._submit(self._stop_all()).result(timeout=15)
        except Exception:
            log.exception("stopping the tool servers failed")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _submit(self, coroutine) -> concurrent.futures.Future:
        if self._closed and not self._loop.is_running():
            coroutine.close()
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_exception(RuntimeError("the tool servers are shut down"))
            return future
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # ---- the loop's thread -------------------------------------------------------------------
    def _set_status(self, name: str, state: str, message: str = "", tools=()) -> None:
        status = ServerStatus(state, message, list(tools))
        self._statuses[name] = status
        try:
            self.on_status(name, status)
        except Exception:
            log.exception("a tool server status listener failed")

    async def _configure(self, servers: list[ServerConfig]) -> None:
        new = {s.name: s for s in servers}
        for name in list(self._connections):
            if new.get(name) != self._configs.get(name):
                await self._stop(name)
        for name in list(self._statuses):
            if name not in new:
                del self._statuses[name]
        self._configs = new

    async def _connection(self, name: str) -> _Connection:
        """The server's running connection, started (or restarted) when there is none."""
        connection = self._connections.get(name)
        if connection is None or connection.task.done():
            config = self._configs.get(name)
            if config is None:
                raise RuntimeError(f"there is no tool server named {name!r}")
            self._set_status(name, "starting", "Starting…")
            connection = _Connection(config, self._logs / f"{''.join(c if c.isalnum() else '_' for c in name)}.log")
            self._connections[name] = connection
            connection.task.add_done_callback(partial(self._ended, name, connection))
        try:
            await asyncio.shield(connection.ready)
        except RuntimeError as e:
            self._set_status(name, "failed", f"Could not start: {e}")
            raise
        if self.status(name).state != "ready":
            self._set_status(name, "ready", f"{len(connection.tools)} tools", connection.tools)
        return connection

    def _ended(self, name: str, connection: _Connection, _task: asyncio.Task) -> None:
        """A connection's task ended: stopped on purpose, or the server went away."""
        if self._connections.get(name) is connection:
            del self._connections[name]
            if not connection.stopping.is_set() and connection.ready.done() and not connection.ready.exception():
                tail = connection.stderr_tail()
                self._set_status(name, "failed", "Stopped unexpectedly; it starts again when next used"
                                 + (f" (it said: {tail})" if tail else ""))
            elif connection.stopping.is_set() and self.status(name).state == "ready":
                self._set_status(name, "stopped")

    async def _tools(self, names: list[str]) -> dict:
        async def one(name):
            try:
                return (await self._connection(name)).tools
            except RuntimeError as e:
                return str(e)
        found = await asyncio.gather(*(one(n) for n in names))
        return dict(zip(names, found))

    async def _call(self, server: str, tool: str, arguments: dict, timeout_s: float) -> ToolResult:
        started = time.monotonic()
        try:
            connection = await self._connection(server)
        except RuntimeError as e:
            return ToolResult("error", f"The tool server {server} could not start: {e}")
        try:
            if connection.session is None:
                raise ConnectionError("its connection closed")
            result = await asyncio.wait_for(connection.session.call_tool(tool, arguments), timeout_s)
        except TimeoutError:
            return ToolResult("timeout", f"The tool did not answer within {timeout_s:g} s.",
                              seconds=time.monotonic() - started)
        except MCPError as e:
            if e.code != CONNECTION_CLOSED:     # the server answered with an error: it runs on
                return ToolResult("error", f"The tool server refused the call: {e.error.message}",
                                  seconds=time.monotonic() - started)
            return await self._broken(connection, e, started)
        except Exception as e:          # noqa: BLE001 - its connection broke, however it did
            return await self._broken(connection, e, started)
        text, images = result_content(result)
        return ToolResult("error" if result.is_error else "ok", text, images, time.monotonic() - started)

    async def _broken(self, connection: _Connection, error: Exception, started: float) -> ToolResult:
        """A call whose server went away: the connection ends (its process is reaped), the status says why, and
        the next use starts the server again."""
        name = connection.config.name
        await asyncio.sleep(0.1)        # its last words reach the log
        reason = connection.reason(error)
        self._set_status(name, "failed", f"Stopped during a call ({reason}); it starts again when next used")
        connection.stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(connection.task), 10)
        except (Exception, asyncio.CancelledError):    # noqa: BLE001 - it is ending anyway
            pass
        return ToolResult("error", f"The tool server {name} stopped during the call: {reason}",
                          seconds=time.monotonic() - started)

    async def _stop(self, name: str) -> None:
        connection = self._connections.get(name)
        if connection is None:
            return
        connection.stopping.set()
        if not connection.ready.done():
            connection.task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(connection.task), 10)
        except (Exception, asyncio.CancelledError):    # noqa: BLE001 - it is being stopped
            pass

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop(n) for n in list(self._connections)))


def result_content(result) -> tuple[str, list[tuple[str, bytes]]]:
    """A CallToolResult as text (capped at MAX_OUTPUT_CHARS) and images (at most MAX_IMAGES of MAX_IMAGE_BYTES)."""
    texts: list[str] = []
    images: list[tuple[str, bytes]] = []
    left_out = 0
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            texts.append(block.text)
        elif kind == "image":
            data = base64.b64decode(block.data)
            if len(images) < MAX_IMAGES and len(data) <= MAX_IMAGE_BYTES:
                images.append((block.mime_type, data))
            else:
                left_out += 1
        elif kind == "resource":
            resource = block.resource
            texts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        else:
            texts.append(f"[{kind} content]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(texts)
    if len(text) > MAX_OUTPUT_CHARS:
        text = text[:MAX_OUTPUT_CHARS] + f"\n[… {len(text) - MAX_OUTPUT_CHARS:,} more characters left out]"
    if left_out:
        text += f"\n[{left_out} image(s) left out: at most {MAX_IMAGES} of {MAX_IMAGE_BYTES >> 20} MiB each]"
    return text, images
