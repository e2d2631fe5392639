"""The endpoint's log in Settings: folded under a button, and while open it follows the server's
last lines (app/server_log.py) once a second."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

from app import icons
from app.widgets import text_button

REFRESH_MS = 1000


class LogView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.log = None                      # a ServerLog, once the window hands it over
        self._shown_written = -1
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(8)
        self.toggle = text_button("Show the server log", "chevron-right")
        self.toggle.setCheckable(True)
        self.toggle.toggled.connect(self._toggled)
        self.text = QPlainTextEdit()
        self.text.setObjectName("serverLog")
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setFixedHeight(180)
        self.text.setPlaceholderText("Nothing yet: the endpoint writes here once it serves a model.")
        self.text.hide()
        column.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        column.addWidget(self.text)
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)

    def set_log(self, log) -> None:
        self.log = log
        self.refresh()

    def refresh(self) -> None:
        if self.log is None or self.log.written == self._shown_written:
            return
        self._shown_written = self.log.written
        bar = self.text.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        self.text.setPlainText("\n".join(self.log.lines()))
        if at_end:
            bar.setValue(bar.maximum())

    def _toggled(self, shown: bool) -> None:
        self.text.setVisible(shown)
        self.toggle.setText("Hide the server log" if shown else "Show the server log")
        self.toggle.setIcon(icons.icon("chevron-down" if shown else "chevron-right"))
        if shown:
            self.refresh()
            self.timer.start()
        else:
            self.timer.stop()

