"""Qwen Desk: start the desktop app (`python -m app` or `qwendesk`)."""

from __future__ import annotations

import os
import sys

from PySide6.QtWidgets import QApplication, QSystemTrayIcon


def build_context():
    from app.catalog import load_catalog
    from app.context import AppContext
    from app.paths import database_path, models_dir
    from app.settings import AppSettings
    from app.store import Store
    from engine.api import probe

    store = Store(database_path())
    return AppContext(store=store, settings=AppSettings.load(store), models_dir=models_dir(), device=probe(),
                      catalog=load_catalog())


def main(argv: list[str] | None = None) -> int:
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
    code = app.exec()
    context.store.close()
    if window.engine.isRunning():
        os._exit(code)           # a model still loading: do not keep the user waiting for it
    return code
