"""A built-in example tool server (stdio MCP): reads the files of one folder, and nothing outside it.

Run as `python files_server.py FOLDER`. Paths are relative to FOLDER; one that resolves outside it (.., a link
leading out) is refused. Read-only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

from pydantic import Field

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

MAX_READ = 100_000      # characters of one file


def files_server(folder: str) -> MCPServer:
    root = Path(folder).resolve()
    server = MCPServer("files", instructions=f"Reads the files under {root}.")

    def inside(relative: str) -> Path:
        path = (root / relative).resolve()
        if path != root and root not in path.parents:
            raise ToolError(f"{relative!r} is outside the shared folder")
        return path

    @server.tool()
    def list_files(folder: Annotated[str, Field(description="a folder under the shared one; . for itself")] = ".",
                   ) -> str:
        """The files and folders in a folder of the shared folder (folders end with /)."""
        try:
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in inside(folder).iterdir())
        except OSError as e:
            raise ToolError(f"{folder!r} cannot be listed: {e.strerror}") from e
        return "\n".join(names) or "(empty)"

    @server.tool()
    def read_file(path: Annotated[str, Field(description="a file's path under the shared folder")]) -> str:
        """A text file's content (at most 100,000 characters)."""
        try:
            text = inside(path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise ToolError(f"{path!r} cannot be read: {e.strerror}") from e
        return text if len(text) <= MAX_READ else text[:MAX_READ] + f"\n[… cut at {MAX_READ:,} characters]"

    return server


if __name__ == "__main__":
    files_server(sys.argv[1] if len(sys.argv) > 1 else ".").run()
