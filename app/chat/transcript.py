"""The transcript: messages in a centred column that follows the reply while it streams (unless
the reader has scrolled up)."""

from __future__ import annotations

from typing import TypeVar

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app import icons
from app.chat.message_view import MessageView, NoticeView
from app.chat.tool_views import ApprovalView, ToolResultView
from app.store import Message
from app.widgets import label

View = TypeVar("View", MessageView, NoticeView, ToolResultView)

COLUMN_WIDTH = 820


class EmptyState(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 80, 0, 0)
        column.setSpacing(10)
        logo = QLabel()
        logo.setPixmap(icons.app_icon().pixmap(48, 48))
        column.addWidget(logo, 0, Qt.AlignmentFlag.AlignHCenter)
        self.title = label("What can I help with?", "emptyTitle")
        self.hint = label("", "muted", wrap=True)
        self.hint.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        column.addWidget(self.title, 0, Qt.AlignmentFlag.AlignHCenter)
        column.addWidget(self.hint)
        column.addStretch(1)


class Transcript(QScrollArea):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        canvas = QWidget()
        canvas.setObjectName("transcriptCanvas")
        outer = QHBoxLayout(canvas)
        outer.setContentsMargins(24, 20, 24, 20)
        self.column_widget = QWidget()
        self.column_widget.setMaximumWidth(COLUMN_WIDTH)
        self.column = QVBoxLayout(self.column_widget)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(22)
        self.column.addStretch(1)
        outer.addStretch(1)
        outer.addWidget(self.column_widget, 100)
        outer.addStretch(1)
        self.setWidget(canvas)
        self.empty_state = EmptyState()
        self.column.insertWidget(0, self.empty_state)
        self.views: list[MessageView | NoticeView | ToolResultView] = []
        self.approval: ApprovalView | None = None
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self._on_range_changed)
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)

    def clear(self) -> None:
        for view in self.views:
            self.column.removeWidget(view)
            view.deleteLater()
        self.views.clear()
        self.close_approval()
        self.empty_state.show()
        self._follow = True

    def add_message(self, message: Message, model_name: str = "") -> MessageView:
        return self._add(MessageView(message, model_name))

    def add_notice(self, message: Message) -> NoticeView:
        return self._add(NoticeView(message))

    def add_tool_result(self, message: Message) -> ToolResultView:
        return self._add(ToolResultView(message))

    def show_approval(self, tool: str, server: str, arguments: dict) -> ApprovalView:
        """The call waiting for the user, at the end of the transcript (one at a time)."""
        self.close_approval()
        self.approval = ApprovalView(tool, server, arguments)
        self.empty_state.hide()
        self.column.insertWidget(self.column.count() - 1, self.approval)
        self.scroll_to_bottom()
        return self.approval

    def close_approval(self) -> None:
        if self.approval is not None:
            self.column.removeWidget(self.approval)
            self.approval.deleteLater()
            self.approval = None

    def message_views(self) -> list[MessageView]:
        return [v for v in self.views if isinstance(v, MessageView)]

    def view_for(self, message_id: int) -> MessageView | None:
        return next((v for v in self.message_views() if v.message.id == message_id), None)

    def remove_message(self, message_id: int) -> None:
        view = next((v for v in self.views if v.message.id == message_id), None)
        if view:
            self.views.remove(view)
            self.column.removeWidget(view)
            view.deleteLater()
        self.empty_state.setVisible(not self.views)

    def scroll_to_bottom(self) -> None:
        self._follow = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _add(self, view: View) -> View:
        self.empty_state.hide()
        self.column.insertWidget(self.column.count() - 1 - (self.approval is not None), view)
        self.views.append(view)
        return view

    def _on_range_changed(self, _min: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    def _on_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 40
