"""A fenced code block: language, copy button, highlighted code that scrolls sideways."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import icons
from app.chat.highlight import highlight_html
from app.theme import mono_font, themed_text
from app.widgets import label


class CodeBlock(QFrame):
    def __init__(self, code: str = "", language: str = "", parent=None):
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.code, self.language = "", ""
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        header = QWidget()
        header.setObjectName("codeHeader")
        row = QHBoxLayout(header)
        row.setContentsMargins(12, 4, 6, 4)
        self.language_label = label("", "codeLanguage")
        self.copy_button = QToolButton()
        self.copy_button.setObjectName("codeCopy")
        self.copy_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.copy_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.copy_button.clicked.connect(self.copy)
        self._show_copy_state(False)
        row.addWidget(self.language_label)
        row.addStretch(1)
        row.addWidget(self.copy_button)
        self.text = QLabel()
        self.text.setObjectName("codeText")
        self.text.setFont(mono_font(9.5))
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.scroll_area = QScrollArea()
        self.scroll_area.setObjectName("codeScroll")
        self.scroll_area.setWidget(self.text)
        self.scroll_area.setWidgetResizable(False)
        self.scroll_area.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        column.addWidget(header)
        column.addWidget(self.scroll_area)
        self.set_code(code, language)

    def set_code(self, code: str, language: str) -> None:
        if code == self.code and language == self.language:
            return
        self.code, self.language = code, language
        self.language_label.setText(language or "code")
        self.text.setText(themed_text(f"<pre style='margin:0'>{highlight_html(code, language)}</pre>"))
        self.text.adjustSize()
        self._fit_height()

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self._show_copy_state(True)
        QTimer.singleShot(1500, self, lambda: self._show_copy_state(False))   # dropped if the block goes

    def _show_copy_state(self, copied: bool) -> None:
        self.copy_button.setText("Copied" if copied else "Copy")
        self.copy_button.setIcon(icons.icon("check" if copied else "copy", icons.MUTED))

    def _fit_height(self) -> None:
        needs_bar = self.text.width() > self.scroll_area.viewport().width()
        bar = self.scroll_area.horizontalScrollBar().sizeHint().height() if needs_bar else 0
        self.scroll_area.setFixedHeight(self.text.height() + bar)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_height()
