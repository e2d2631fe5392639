"""One message of the transcript.

A user message is a bubble on the right (with its images; a long paste folded); a reply spans the
column: who answered, the folded reasoning, the content, the numbers (the speed live while it
streams), and its actions (Continue when it hit its token limit).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout

from app import icons
from app.chat.blocks import ShownCall
from app.chat.content_view import ContentView
from app.chat.image_viewer import Thumbnail
from app.chat.long_text import LongText
from app.chat.metrics import metrics_line
from app.chat.thinking_block import ThinkingBlock
from app.store import Message
from app.widgets import icon_button, label, layout_widgets, set_enabled, text_button

THUMB = 96
BUBBLE_TEXT_WIDTH = 560


class MessageView(QFrame):
    regenerate_requested = Signal()
    continue_requested = Signal()
    delete_requested = Signal()
    edit_requested = Signal()
    version_requested = Signal(int)     # a reply's version to show (0-based)

    def __init__(self, message: Message, model_name: str = "", parent=None):
        super().__init__(parent)
        self.message = message
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(6)
        self.button_row = QHBoxLayout()
        self.button_row.setSpacing(2)
        copy = icon_button("copy", "Copy message", size=15)
        copy.clicked.connect(self._copy)
        self.button_row.addWidget(copy)
        self.delete_button = icon_button("trash", "Delete this message", size=15)
        self.delete_button.clicked.connect(self.delete_requested)
        self.button_row.addWidget(self.delete_button)
        if message.role == "user":
            self._build_user(message)
        else:
            self._build_assistant(message, model_name)

    # ---- user ------------------------------------------------------------------------------
    def _build_user(self, message: Message) -> None:
        self.edit_button = icon_button("edit", "Edit and resend (Up in the empty message box)", size=15)
        self.edit_button.clicked.connect(self.edit_requested)
        self.button_row.insertWidget(0, self.edit_button)
        bubble = QFrame()
        bubble.setObjectName("userBubble")
        inner = QVBoxLayout(bubble)
        inner.setContentsMargins(14, 10, 14, 10)
        inner.setSpacing(8)
        if message.attachments:
            thumbs = QHBoxLayout()
            thumbs.setSpacing(6)
            for path in message.attachments:
                thumbs.addWidget(Thumbnail(path, THUMB))
            thumbs.addStretch(1)
            inner.addLayout(thumbs)
        if message.content:
            self.text = LongText(message.content)
            shown = self.text.text.text()
            metrics = self.text.text.fontMetrics()
            longest = max(metrics.horizontalAdvance(line) for line in shown.splitlines() or [""])
            self.text.text.setMinimumWidth(min(longest + 2, BUBBLE_TEXT_WIDTH))
            inner.addWidget(self.text)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(bubble, 0)
        bubble.setMaximumWidth(BUBBLE_TEXT_WIDTH + 28)
        self.column.addLayout(row)
        right = QHBoxLayout()
        right.addStretch(1)
        right.addLayout(self.button_row)
        self.column.addLayout(right)

    # ---- assistant -------------------------------------------------------------------------
    def _build_assistant(self, message: Message, model_name: str) -> None:
        self.regenerate_button = icon_button("regenerate", "Regenerate", size=15)
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.button_row.addWidget(self.regenerate_button)
        self.continue_button = text_button("Continue", "play")
        self.continue_button.setObjectName("continueButton")
        self.continue_button.setToolTip("The reply hit its token limit: let it go on in this message")
        self.continue_button.clicked.connect(self.continue_requested)
        self.continue_button.hide()
        self.versions = VersionSwitch()
        self.versions.requested.connect(self.version_requested)
        header = QHBoxLayout()
        header.setSpacing(8)
        avatar = QLabel()
        avatar.setPixmap(icons.app_icon().pixmap(20, 20))
        header.addWidget(avatar)
        self.fallback_name = model_name or "Assistant"      # replies from before messages recorded their model
        self.speaker = label("", "speaker")
        header.addWidget(self.speaker)
        header.addStretch(1)
        self.column.addLayout(header)
        self.thinking = ThinkingBlock()
        self.content = ContentView()
        self.error = label("", "messageError", wrap=True, selectable=True)
        self.metrics = label("", "metrics", wrap=True)
        self.column.addWidget(self.thinking)
        self.column.addWidget(self.content)
        self.column.addWidget(self.error)
        footer = QHBoxLayout()
        footer.setSpacing(10)
        footer.addWidget(self.versions)
        footer.addLayout(self.button_row)
        footer.addWidget(self.metrics, 1)
        footer.addWidget(self.continue_button)
        self.column.addLayout(footer)
        self.update_reply(message.content, message.reasoning, streaming=message.status == "streaming")
        self.finish(message)

    def update_reply(self, content: str, reasoning: str, streaming: bool, thinking_s: float | None = None) -> None:
        self.message.content, self.message.reasoning = content, reasoning
        self.thinking.setVisible(bool(reasoning.strip()))
        self.thinking.set_text(reasoning, streaming=streaming and not content, seconds=thinking_s)
        self.content.set_text(content, [ShownCall.from_dict(c) for c in self.message.tool_calls], writing=streaming)
        self.actions_visible(not streaming)
        if streaming:
            self.continue_button.hide()
            self.error.hide()

    def set_live_rate(self, tokens: int, tok_s: float | None) -> None:
        """The reply's numbers while it streams."""
        self.metrics.setText(f"{tokens:,} tokens" + (f"  ·  {tok_s:.1f} tok/s" if tok_s else ""))

    def finish(self, message: Message) -> None:
        """Show the final state of a reply: numbers, stop reason, error."""
        self.message = message
        self.versions.set_versions(message.version, message.version_count)
        self._show_writer(message.metrics.get("model") or {})
        if message.status == "streaming":
            return
        seconds = message.metrics.get("thinking_s")
        self.update_reply(message.content, message.reasoning, streaming=False, thinking_s=seconds)
        reason = {"stopped": "cancelled", "error": "error"}.get(message.status, message.metrics.get("finish", ""))
        self.metrics.setText(metrics_line(message.metrics, reason))
        self.error.setVisible(bool(message.error))
        self.error.setText(message.error)

    def _show_writer(self, writer: dict) -> None:
        """The model that wrote this version of the reply, as it ran then."""
        self.speaker.setText(writer.get("name") or self.fallback_name)
        details = [f"{writer['weights']} weights" if writer.get("weights") else "",
                   f"speculation: {writer['drafts']} drafts" if writer.get("drafts") else ""]
        self.speaker.setToolTip(" · ".join(d for d in details if d))

    def actions_visible(self, visible: bool) -> None:
        for button in layout_widgets(self.button_row):
            button.setVisible(visible)
        if self.message.role == "assistant":
            set_enabled(self.versions, visible, "Wait for the reply to finish")

    def set_can_regenerate(self, allowed: bool) -> None:
        self.regenerate_button.setVisible(allowed)
        self.continue_button.setVisible(allowed and self.message.metrics.get("finish") == "length"
                                        and self.message.status == "complete")

    def set_can_edit(self, allowed: bool) -> None:
        self.edit_button.setVisible(allowed)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)


class VersionSwitch(QFrame):
    """‹ 2/3 › under a regenerated reply: which of its versions is shown."""
    requested = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("versionSwitch")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        self.previous = icon_button("chevron-left", "Previous version", size=14)
        self.next = icon_button("chevron-right", "Next version", size=14)
        self.label = label("", "metrics")
        self.index, self.count = 0, 1
        self.previous.clicked.connect(lambda: self.requested.emit(self.index - 1))
        self.next.clicked.connect(lambda: self.requested.emit(self.index + 1))
        row.addWidget(self.previous)
        row.addWidget(self.label)
        row.addWidget(self.next)
        self.hide()

    def set_versions(self, index: int, count: int) -> None:
        self.index, self.count = index, count
        self.label.setText(f"{index + 1}/{count}")
        set_enabled(self.previous, index > 0, "This is the first version", "Previous version")
        set_enabled(self.next, index < count - 1, "This is the latest version", "Next version")
        self.setVisible(count > 1)


NOTICE_ACTIONS = {"new_chat": ("Start a new chat", "plus"), "leave_out": ("Leave out the oldest messages", "")}


class NoticeView(QFrame):
    """A quiet line in the transcript (images not sent, errors without a reply), with the choices it
    offers, if any (message.metrics["actions"]: NOTICE_ACTIONS)."""
    action_requested = Signal(str)

    def __init__(self, message: Message, parent=None):
        super().__init__(parent)
        self.message = message
        self.setObjectName("notice")
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.setSpacing(8)
        glyph = QLabel()
        glyph.setPixmap(icons.pixmap("info", 14, icons.WARNING))
        row.addWidget(glyph, 0, Qt.AlignmentFlag.AlignTop)
        column = QVBoxLayout()
        column.setSpacing(8)
        column.addWidget(label(message.content, "noticeText", wrap=True, selectable=True))
        self.buttons = {}
        if message.metrics.get("actions"):
            buttons = QHBoxLayout()
            for action in message.metrics["actions"]:
                text, icon_name = NOTICE_ACTIONS[action]
                self.buttons[action] = button = text_button(text, icon_name)
                button.clicked.connect(lambda _=False, a=action: self.action_requested.emit(a))
                buttons.addWidget(button)
            buttons.addStretch(1)
            column.addLayout(buttons)
        row.addLayout(column, 1)
