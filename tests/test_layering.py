"""The layering ARCHITECTURE.md promises, checked on the source: app/ knows the engine only through engine.api,
the HTTP server takes what it needs of the engine from engine.api too, the engine never imports Qt or the app, and
the kernels import neither."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports(package: str):
    """(file, imported module) for every import in a package, lazy ones inside functions included."""
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path.relative_to(ROOT).as_posix(), alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                yield path.relative_to(ROOT).as_posix(), node.module


def top(module: str) -> str:
    return module.split(".")[0]


def test_the_app_imports_the_engine_only_through_its_api():
    """...and the endpoint from engine.server (FastAPI is imported only when the user switches it on)."""
    bad = [(f, m) for f, m in imports("app") if top(m) in ("engine", "qwendesk_kernels") and m not in ("engine.api",
                                                                                              "engine.server")]
    assert bad == []


def test_the_server_takes_the_engine_from_its_api():
    """Its command line (server/cli.py, the program on top) also shares the argument checks of engine/commands/args.py
    with qwendesk-chat."""
    allowed = {("engine/server/cli.py", "engine.commands.args")}
    bad = [(f, m) for f, m in imports("engine/server") if top(m) in ("engine", "qwendesk_kernels") and m != "engine.api"
           and not m.startswith("engine.server") and (f, m) not in allowed]
    assert bad == []


# engine/server/'s floors, lowest first: the HTTP layer, the bridge to the engine, the OpenAI API, the two APIs built
# beside it (responses/ runs on OpenAI's conversion), then the app, its state, the command line and the small routes
SERVER_FLOORS = {"http": 0, "bridge": 1, "openai": 2, "anthropic": 3, "responses": 3, "": 4}


def server_package(module: str) -> str:
    """engine.server.openai.routes -> "openai"; a module at engine/server/'s top (or the package itself) -> ""."""
    name = module.split(".")[2] if module.count(".") >= 2 else ""
    return name if name in SERVER_FLOORS else ""


def test_the_servers_floors_import_only_downwards():
    """A sub-package of engine/server/ imports its own modules and lower floors only (never a sibling on its floor)."""
    found = [(f, m) for f, m in imports("engine/server") if m.startswith("engine.server")]
    bad = []
    for f, m in found:
        mine = server_package(f.removesuffix(".py").replace("/", "."))
        theirs = server_package(m)
        if theirs != mine and SERVER_FLOORS[theirs] >= SERVER_FLOORS[mine]:
            bad.append((f, m))
    assert len(found) > 50 and bad == []


@pytest.mark.parametrize("package, banned", [("engine", ("app", "PySide6")),
                                             ("qwendesk_kernels", ("app", "engine", "PySide6"))])
def test_lower_floors_never_import_upper_ones(package, banned):
    bad = [(f, m) for f, m in imports(package) if top(m) in banned]
    assert bad == []


def test_the_checker_sees_lazy_imports(tmp_path):
    """A guard against a checker that passes by seeing nothing: the app does import engine.api, and engine.server
    lazily."""
    found = {m for f, m in imports("app") if top(m) == "engine"}
    assert found == {"engine.api", "engine.server"}


def test_the_chat_page_talks_to_its_session_only():
    """app/chat/chat_page.py reads no store and no file and writes none, and asks no backend what it has: the chat
    session (app/chat/session.py) does those, over the typed ChatBackend."""
    tree = ast.parse((ROOT / "app/chat/chat_page.py").read_text(encoding="utf-8"))
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert attributes & {"store", "backend", "read_text", "write_text", "read_bytes", "write_bytes"} == set()
    assert called & {"open", "getattr", "hasattr"} == set()
    assert "session" in attributes and "dialogs" in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
