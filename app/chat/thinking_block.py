"""The model's reasoning: a folded "Thinking" block the reader can open."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QToolButton, QVBoxLayout

from app import icons
from app.formatting import human_duration
from app.widgets import label


class ThinkingBlock(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingBlock")
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        self.toggle = QToolButton()
        self.toggle.setObjectName("thinkingToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.toggled.connect(self.set_open)
        self.body = label("", "thinkingText", wrap=True, selectable=True)
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        column.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        column.addWidget(self.body)
        self._streaming = False
        self._seconds: float | None = None
        self.set_open(False)

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def set_text(self, text: str, streaming: bool, seconds: float | None = None) -> None:
        self.body.setText(text.strip())
        self._streaming, self._seconds = streaming, seconds
        self._update_title()

    def set_open(self, open_: bool) -> None:
        if self.toggle.isChecked() != open_:
            self.toggle.setChecked(open_)
        self.body.setVisible(open_)
        self._update_title()

    def _update_title(self) -> None:
        if self._streaming:
            title = "Thinking…"
        elif self._seconds is not None:
            took = f"{self._seconds:.1f} s" if self._seconds < 10 else human_duration(self._seconds)
            title = f"Thought for {took}"
        else:
            title = "Thoughts"
        self.toggle.setText(title)
        self.toggle.setIcon(icons.icon("chevron-down" if self.is_open else "chevron-right", icons.MUTED))
