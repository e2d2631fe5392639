"""A tool call the model made: the function's name and its arguments."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout

from app import icons
from app.chat.blocks import ShownCall
from app.theme import mono_font
from app.widgets import label


class ToolCallView(QFrame):
    def __init__(self, call: ShownCall, parent=None):
        super().__init__(parent)
        self.setObjectName("toolCall")
        column = QVBoxLayout(self)
        column.setContentsMargins(12, 8, 12, 10)
        column.setSpacing(6)
        row = QHBoxLayout()
        row.setSpacing(8)
        glyph = QLabel()
        glyph.setPixmap(icons.pixmap("tool", 14, icons.ACCENT))
        self.title = label("", "toolCallTitle")
        row.addWidget(glyph)
        row.addWidget(self.title)
        row.addStretch(1)
        self.arguments = label("", "toolCallArgs", wrap=True, selectable=True)
        self.arguments.setTextFormat(Qt.TextFormat.PlainText)
        self.arguments.setFont(mono_font(9.5))
        column.addLayout(row)
        column.addWidget(self.arguments)
        self.set_call(call)

    def set_call(self, call: ShownCall) -> None:
        state = "" if call.complete else "  (writing…)"
        self.title.setText(f"Tool call  ·  {call.name}{state}")
        lines = [f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in call.arguments.items()]
        self.arguments.setText("\n".join(lines) or ("no arguments" if call.complete else "…"))
