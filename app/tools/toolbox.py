"""ToolBox: the tool servers as the GUI thread sees them: their settings (saved at once), their status, and
listings and calls whose answers come back on the GUI thread as callbacks."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.tools.config import ServerConfig, ToolSettings, load_tool_settings, save_tool_settings
from app.tools.manager import ServerStatus, ToolServers


class ToolBox(QObject):
    status_changed = Signal(str, object)        # server name, ServerStatus
    settings_changed = Signal()
    _deliver = Signal(object, object)           # callback, value: from the servers' thread to this one

    def __init__(self, call_timeout_s: float | None = None, parent=None):
        super().__init__(parent)
        self.settings: ToolSettings = load_tool_settings()
        self._deliver.connect(lambda callback, value: callback(value))
        self.servers = ToolServers(on_status=self.status_changed.emit,
                                   **({"call_timeout_s": call_timeout_s} if call_timeout_s else {}))
        self.servers.configure(self.usable())

    def usable(self) -> list[ServerConfig]:
        """The servers a chat may turn on: configured and not switched off."""
        return [s for s in self.settings.servers if not s.disabled]

    def status(self, name: str) -> ServerStatus:
        return self.servers.status(name)

    def set_settings(self, settings: ToolSettings) -> None:
        self.settings = settings
        save_tool_settings(settings)
        self.servers.configure(self.usable())
        self.settings_changed.emit()

    def add_servers(self, servers: list[ServerConfig]) -> None:
        """Servers added (one of the same name is replaced)."""
        names = {s.name for s in servers}
        kept = [s for s in self.settings.servers if s.name not in names]
        self.set_settings(ToolSettings(kept + servers, self.settings.always_allowed, self.settings.max_rounds))

    def remove_server(self, name: str) -> None:
        self.set_settings(ToolSettings([s for s in self.settings.servers if s.name != name],
                                       [a for a in self.settings.always_allowed if not a.startswith(name + "/")],
                                       self.settings.max_rounds))

    def allow_always(self, server: str, tool: str) -> None:
        key = f"{server}/{tool}"
        if key not in self.settings.always_allowed:
            self.settings.always_allowed.append(key)
            self.set_settings(self.settings)

    def always_allowed(self, server: str, tool: str) -> bool:
        return f"{server}/{tool}" in self.settings.always_allowed

    def list_tools(self, names: list[str], then: Callable[[dict], None]) -> None:
        """then({name: [ToolInfo] or why it could not start}) on this thread."""
        self.servers.tools(names).add_done_callback(lambda f: self._deliver.emit(then, f.result()))

    def call(self, server: str, tool: str, arguments: dict, then: Callable[[object], None]) -> None:
        """then(ToolResult) on this thread."""
        self.servers.call(server, tool, arguments).add_done_callback(lambda f: self._deliver.emit(then, f.result()))

    def close(self) -> None:
        self.servers.close()
