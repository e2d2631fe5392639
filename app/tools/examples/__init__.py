"""The built-in tool servers, small stdio MCP servers the app starts as child processes."""


def run_builtin(name: str, folder: str = "") -> int:
    """Serve a built-in server on stdin/stdout (the frozen app's `--tool-server NAME [FOLDER]`)."""
    if name == "files":
        from app.tools.examples.files_server import files_server
        files_server(folder or ".").run()
    else:
        from app.tools.examples.calc_clock_server import server
        server.run()
    return 0
