"""Qwen Desk desktop app: the main window."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QListWidget, QMainWindow, QStackedWidget,
                               QVBoxLayout, QWidget)

PAGES = ("Chat", "Models", "Settings")


def _placeholder(title: str, text: str) -> QWidget:
    page = QWidget()
    layout = QVBoxLayout(page)
    heading = QLabel(title)
    heading.setObjectName("pageTitle")
    body = QLabel(text)
    body.setWordWrap(True)
    layout.addWidget(heading)
    layout.addWidget(body)
    layout.addStretch(1)
    return page


class MainWindow(QMainWindow):
    def __init__(self):
        super().__init__()
        self.setWindowTitle("Qwen Desk")
        self.resize(1100, 720)
        self.nav = QListWidget()
        self.nav.addItems(PAGES)
        self.nav.setFixedWidth(160)
        self.stack = QStackedWidget()
        self.stack.addWidget(_placeholder("Chat", "Pick a model on the Models page to start chatting."))
        self.stack.addWidget(_placeholder("Models", "No model yet. Downloading and local models arrive here."))
        self.stack.addWidget(_placeholder("Settings", "Engine settings and the local endpoint arrive here."))
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        central = QWidget()
        row = QHBoxLayout(central)
        row.addWidget(self.nav)
        row.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.nav.setCurrentRow(PAGES.index("Models"))


def main(argv: list[str] | None = None) -> int:
    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv)
    app.setApplicationName("Qwen Desk")
    window = MainWindow()
    window.show()
    return app.exec()
