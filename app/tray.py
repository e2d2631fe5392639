"""The tray icon: show the window, see what is loaded, quit."""

from __future__ import annotations

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.icons import app_icon


class Tray(QSystemTrayIcon):
    def __init__(self, window):
        super().__init__(app_icon(), window)
        self.window = window
        menu = QMenu()
        show = QAction("Show Qwen Desk", menu)
        show.triggered.connect(window.bring_to_front)
        self.status = QAction("No model loaded", menu)
        self.status.setEnabled(False)
        quit_action = QAction("Quit", menu)
        quit_action.triggered.connect(window.quit)
        menu.addAction(show)
        menu.addAction(self.status)
        menu.addSeparator()
        menu.addAction(quit_action)
        self.setContextMenu(menu)
        self._menu = menu
        self.setToolTip("Qwen Desk")
        self.activated.connect(self._activated)

    def set_status(self, text: str) -> None:
        self.status.setText(text)
        self.setToolTip(f"Qwen Desk: {text}")

    def _activated(self, reason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.window.bring_to_front()
