"""Qwen Desk: start the desktop app (`python -m app` or `qwendesk`)."""

from __future__ import annotations

import os
import sys

from PySide6.QtWidgets import QApplication, QSystemTrayIcon


def build_context():
    from app.catalog import load_catalog
    from app.context import AppContext
    from app.gpu import detect_gpu
    from app.paths import database_path, models_dir
    from app.settings import AppSettings
    from app.store import Store

    store = Store(database_path())
    return AppContext(store=store, settings=AppSettings.load(store), models_dir=models_dir(), gpu=detect_gpu(),
                      catalog=load_catalog())


def main(argv: list[str] | None = None) -> int:
    from app.smoke import prepare, smoke_folder

    smoke_dir = smoke_folder()          # QWENDESK_SMOKE: the packaged app's smoke run (app/smoke.py)
    if smoke_dir is not None:
        prepare(smoke_dir)
    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv)
    app.setApplicationName("Qwen Desk")
    app.setDesktopFileName("qwendesk")

    from app.paths import data_dir
    from app.single_instance import SingleInstance, instance_key

    instance = SingleInstance(instance_key(str(data_dir())))
    if instance.notify_running():
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
