"""Tool servers (MCP) the app knows: their configuration, kept in tool_servers.json in the data folder.

The file holds the `mcpServers` map that Claude Desktop, LM Studio and Cursor use (a stdio server: command, args,
env; a Streamable HTTP one: url, headers), so it can be pasted in or out, plus what the app adds: the built-in
servers switched on, the tools the user always allows, and the cap on tool rounds in one reply.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.paths import data_dir

log = logging.getLogger("qwendesk.app")

EXAMPLES = Path(__file__).resolve().parent / "examples"
# the built-in servers: name -> (script, what it does); the files one is given the folder it may read
BUILTINS = {"calculator-clock": ("calc_clock_server.py", "A calculator and a clock (no network, no files)."),
            "files": ("files_server.py", "Reads the files of one folder you pick, and nothing outside it.")}
DEFAULT_MAX_ROUNDS = 8


@dataclass
class ServerConfig:
    name: str
    command: str = ""                   # stdio: the program, its arguments and extra environment
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""                       # Streamable HTTP: the endpoint and headers sent with each request
    headers: dict[str, str] = field(default_factory=dict)
    builtin: str = ""                   # one of BUILTINS: the command is this Python running its script
    folder: str = ""                    # the files built-in: the folder it may read
    disabled: bool = False

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    def launch(self) -> tuple[str, list[str]]:
        """The command and arguments that start a stdio server (a built-in one: this Python running its script, or
        the frozen app itself with --tool-server, app/main.py)."""
        if self.builtin:
            folder = [self.folder] if self.builtin == "files" else []
            if getattr(sys, "frozen", False):
                return sys.executable, ["--tool-server", self.builtin, *folder]
            return sys.executable, [str(EXAMPLES / BUILTINS[self.builtin][0]), *folder]
        return self.command, list(self.args)

    def describe(self) -> str:
        if self.builtin:
            return BUILTINS[self.builtin][1] + (f" Folder: {self.folder}" if self.folder else "")
        if self.url:
            return self.url
        return " ".join([self.command, *self.args])

    def as_entry(self) -> dict:
        """The server as an mcpServers entry (with the app's own keys for a built-in)."""
        entry: dict[str, object]
        if self.builtin:
            entry = {"qwendeskBuiltin": self.builtin, **({"folder": self.folder} if self.folder else {})}
        elif self.url:
            entry = {"type": "http", "url": self.url, **({"headers": self.headers} if self.headers else {})}
        else:
            entry = {"command": self.command, "args": self.args, **({"env": self.env} if self.env else {})}
        return {**entry, **({"disabled": True} if self.disabled else {})}


def parse_servers(data) -> list[ServerConfig]:
    """Servers from an mcpServers JSON document (the whole `{"mcpServers": {...}}` or the map alone). ValueError
    says what is wrong with an entry."""
    if isinstance(data, dict) and isinstance(data.get("mcpServers"), dict):
        data = data["mcpServers"]
    if not isinstance(data, dict) or not data:
        raise ValueError('Expected {"mcpServers": {"name": {"command": ...} or {"url": ...}}}.')
    return [_server(name, entry) for name, entry in data.items()]


def _server(name: str, entry) -> ServerConfig:
    if not isinstance(entry, dict):
        raise ValueError(f"Server {name!r}: its entry must be an object.")
    disabled = bool(entry.get("disabled", False))
    if entry.get("qwendeskBuiltin") in BUILTINS:
        return ServerConfig(name, builtin=entry["qwendeskBuiltin"], folder=str(entry.get("folder", "")),
                            disabled=disabled)
    kind = entry.get("type", entry.get("transport", ""))
    if kind == "sse":
        raise ValueError(f"Server {name!r}: the old SSE transport is not supported; use its Streamable HTTP URL.")
    if "url" in entry or "serverUrl" in entry:
        url, headers = entry.get("url") or entry.get("serverUrl"), entry.get("headers") or {}
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"Server {name!r}: url must start with http:// or https://.")
        if not _strings(headers):
            raise ValueError(f"Server {name!r}: headers must map names to strings.")
        return ServerConfig(name, url=url, headers=dict(headers), disabled=disabled)
    command, args, env = entry.get("command"), entry.get("args") or [], entry.get("env") or {}
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"Server {name!r}: give a command (a stdio server) or a url (a Streamable HTTP one).")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"Server {name!r}: args must be a list of strings.")
    if not _strings(env):
        raise ValueError(f"Server {name!r}: env must map names to strings.")
    return ServerConfig(name, command=command, args=list(args), env=dict(env), disabled=disabled)


def _strings(mapping) -> bool:
    return isinstance(mapping, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())


@dataclass
class ToolSettings:
    servers: list[ServerConfig] = field(default_factory=list)
    always_allowed: list[str] = field(default_factory=list)    # "server/tool": runs without asking
    max_rounds: int = DEFAULT_MAX_ROUNDS                       # model replies in one turn that may call tools

    def server(self, name: str) -> ServerConfig | None:
        return next((s for s in self.servers if s.name == name), None)

    def to_json(self) -> dict:
        return {"mcpServers": {s.name: s.as_entry() for s in self.servers},
                "alwaysAllowed": self.always_allowed, "maxRounds": self.max_rounds}

    @classmethod
    def from_json(cls, data: dict) -> ToolSettings:
        servers = parse_servers(data) if data.get("mcpServers") else []
        return cls(servers, [a for a in data.get("alwaysAllowed", []) if isinstance(a, str)],
                   int(data.get("maxRounds", DEFAULT_MAX_ROUNDS)))


def settings_path() -> Path:
    return data_dir() / "tool_servers.json"


def load_tool_settings(path: Path | None = None) -> ToolSettings:
    """The saved tool settings; none saved (or a file that cannot be read) gives the defaults."""
    path = path or settings_path()
    try:
        return ToolSettings.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return ToolSettings()
    except (OSError, ValueError, TypeError) as e:
        log.warning("%s could not be read (%s); no tool servers are configured", path, e)
        return ToolSettings()


def save_tool_settings(settings: ToolSettings, path: Path | None = None) -> None:
    path = path or settings_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(settings.to_json(), indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
