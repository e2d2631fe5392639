"""A user message's text in its bubble: a long paste shows its first lines and a toggle to see it all."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget

from app.formatting import breakable
from app.widgets import label

FOLD_LINES = 14         # longer than this (or FOLD_CHARS), a message is shown folded
FOLD_CHARS = 1500
SHOWN_LINES = 8


def folded(text: str) -> str | None:
    """The head of a long text, or None when it is short enough to show whole."""
    lines = text.splitlines()
    if len(lines) <= FOLD_LINES and len(text) <= FOLD_CHARS:
        return None
    head = "\n".join(lines[:SHOWN_LINES])
    return (head[:FOLD_CHARS // 2] if len(head) > FOLD_CHARS // 2 else head).rstrip() + " …"


class LongText(QWidget):
    def __init__(self, text: str, parent=None):
        super().__init__(parent)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        self.full = text
        self.head = folded(text)
        self.text: QLabel = label(breakable(self.head or text), "userText", wrap=True, selectable=True)
        self.text.setTextFormat(Qt.TextFormat.PlainText)
        column.addWidget(self.text)
        self.toggle = QPushButton()
        self.toggle.setObjectName("foldToggle")
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.clicked.connect(self._toggle)
        self.toggle.setVisible(self.head is not None)
        column.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.expanded = False
        self._show()

    def _toggle(self) -> None:
        self.expanded = not self.expanded
        self._show()

    def _show(self) -> None:
        if self.head is None:
            return
        self.text.setText(breakable(self.full if self.expanded else self.head))
        lines, chars = len(self.full.splitlines()), len(self.full)
        self.toggle.setText("Show less" if self.expanded else f"Show all ({lines:,} lines, {chars:,} characters)")
