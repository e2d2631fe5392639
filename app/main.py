"""Qwen Desk: start the desktop app (`python -m app` or `qwendesk`)."""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError, version


def build_context():
    from app.catalog import load_catalog
    from app.context import AppContext
    from app.paths import database_path, models_dir
    from app.settings import AppSettings
    from app.store import Store
    from engine.api import probe

    store = Store(database_path())
    return AppContext(store=store, settings=AppSettings.load(store), models_dir=models_dir(), device=probe(),
                      catalog=load_catalog(), probe=probe)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="qwendesk", description="Qwen Desk: download a Qwen3.5-family model and chat "
                                 "with it on this computer. Run without arguments to open the window.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    # the frozen app serving one of its built-in tool servers (app/tools/config.py ServerConfig.launch)
    ap.add_argument("--tool-server", nargs="+", metavar=("NAME", "FOLDER"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def package_version() -> str:
    try:
        return version("qwendesk")
    except PackageNotFoundError:    # running from a source tree that pip has not installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    """argv: the command-line arguments after the program name (default: sys.argv[1:])."""
    args = parse_args(argv)
    if args.tool_server:
        from app.tools.examples import run_builtin
        return run_builtin(*args.tool_server[:2])
    from app.qt_libraries import qt_library_problem

    problem = qt_library_problem()        # Qt's own abort names at most one of the missing libraries
    if problem:
        print(problem, file=sys.stderr)
        return 1
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon

    from app.smoke import prepare, smoke_folder

    smoke_dir = smoke_folder()          # QWENDESK_SMOKE: the packaged app's smoke run (app/smoke.py)
    if smoke_dir is not None:
        prepare(smoke_dir)
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    app.setApplicationName("Qwen Desk")
    app.setDesktopFileName("qwendesk")

    from app.paths import data_dir
    from app.single_instance import SingleInstance, instance_key

    instance = SingleInstance(instance_key(str(data_dir())))
    if instance.notify_running():
        print("Qwen Desk is already running: its window was brought to the front.")
        return 0
    instance.listen()

    from app.icons import app_icon
    from app.theme import apply_theme
    from app.tray import Tray
    from app.window import MainWindow

    apply_theme(app)
    app.setWindowIcon(app_icon())
    context = build_context()
    window = MainWindow(context)
    instance.activated.connect(window.bring_to_front)
    if QSystemTrayIcon.isSystemTrayAvailable():
        window.tray = Tray(window)
        window.tray.show()
        app.setQuitOnLastWindowClosed(False)
        window.quit_requested.connect(app.quit)
    window.show()
    smoke_run = None
    if smoke_dir is not None:
        from app.smoke import SmokeRun

        smoke_run = SmokeRun(window, smoke_dir)
    code = app.exec()
    context.store.close()
    if window.engine.isRunning():
        os._exit(code)           # a model still loading: do not keep the user waiting for it
    return smoke_run.code if smoke_run is not None else code
