"""The transcript's tool blocks: a call waiting for the user's approval, and a call's result (folded when long)."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout

from app import icons
from app.chat.image_viewer import Thumbnail
from app.store import Message
from app.theme import mono_font
from app.widgets import label, text_button

STATUS_WORDS = {"ok": "", "error": "failed", "timeout": "timed out", "denied": "denied"}
FOLDED_LINES = 8            # a result longer than this starts folded
THUMB = 120


def pretty(value) -> str:
    """Arguments or a result as the reader wants them: JSON indented, other text as it is."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if not isinstance(parsed, (dict, list)):
            return value
        value = parsed
    return json.dumps(value, indent=2, ensure_ascii=False)


def mono(text: str, name: str):
    body = label(text, name, wrap=True, selectable=True)
    body.setTextFormat(Qt.TextFormat.PlainText)
    body.setFont(mono_font(9.5))
    return body


class ApprovalView(QFrame):
    """A call the model wants to make, before it runs: Allow once / Always allow this tool / Deny."""
    decided = Signal(str)           # once | always | deny

    def __init__(self, tool: str, server: str, arguments: dict, parent=None):
        super().__init__(parent)
        self.setObjectName("toolApproval")
        column = QVBoxLayout(self)
        column.setContentsMargins(14, 12, 14, 12)
        column.setSpacing(8)
        row = QHBoxLayout()
        row.setSpacing(8)
        glyph = QLabel()
        glyph.setPixmap(icons.pixmap("tool", 16, icons.WARNING))
        row.addWidget(glyph)
        self.title = label(f"Run {tool} on the tool server {server}?", "toolApprovalTitle")
        row.addWidget(self.title, 1)
        column.addLayout(row)
        column.addWidget(label("It runs with your rights. Check the arguments:", "muted", wrap=True))
        self.arguments = mono(pretty(arguments) if arguments else "(no arguments)", "toolArgs")
        column.addWidget(self.arguments)
        buttons = QHBoxLayout()
        self.allow = text_button("Allow once", "check", kind="primary")
        self.always = text_button(f"Always allow {tool}")
        self.deny = text_button("Deny", "close")
        for button, choice in ((self.allow, "once"), (self.always, "always"), (self.deny, "deny")):
            button.clicked.connect(lambda _=False, c=choice: self.decided.emit(c))
            buttons.addWidget(button)
        buttons.addStretch(1)
        column.addLayout(buttons)


class ToolResultView(QFrame):
    """A stored "tool" message: which tool ran where, with what, and what came back (text, JSON, images)."""

    def __init__(self, message: Message, parent=None):
        super().__init__(parent)
        self.message = message
        m = message.metrics
        status = m.get("status", "ok")
        self.setObjectName("toolResult")
        self.setProperty("status", status)
        column = QVBoxLayout(self)
        column.setContentsMargins(12, 8, 12, 10)
        column.setSpacing(6)
        self.toggle = QToolButton()
        self.toggle.setObjectName("toolResultToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        where = f"  ·  {m['server']}" if m.get("server") else ""
        seconds = m.get("seconds") or 0
        took = f"  ·  {seconds:.1f} s" if seconds >= 0.1 else f"  ·  {seconds * 1000:.0f} ms" if seconds else ""
        state = STATUS_WORDS.get(status, status)
        self.toggle.setText(f"{m.get('tool', 'tool')}{where}{took}" + (f"  ·  {state}" if state else ""))
        column.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.body = QFrame()
        inner = QVBoxLayout(self.body)
        inner.setContentsMargins(18, 0, 0, 0)
        inner.setSpacing(6)
        if m.get("arguments"):              # the call above shows them too; here they travel with the result
            self.setToolTip("Arguments: " + json.dumps(m["arguments"], ensure_ascii=False))
        if status != "ok":
            inner.addWidget(label("What the model was told", "toolSection"))
        self.result = mono(pretty(message.content) or "(no text)", "toolOutput")
        inner.addWidget(self.result)
        if message.attachments:
            thumbs = QHBoxLayout()
            for path in message.attachments:
                thumbs.addWidget(Thumbnail(path, THUMB))
            thumbs.addStretch(1)
            inner.addLayout(thumbs)
        column.addWidget(self.body)
        self.toggle.toggled.connect(self.set_open)
        long = message.content.count("\n") >= FOLDED_LINES or len(message.content) > 600
        self.set_open(not long)

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def set_open(self, open_: bool) -> None:
        if self.toggle.isChecked() != open_:
            self.toggle.setChecked(open_)
        self.body.setVisible(open_)
        icon = "chevron-down" if open_ else "chevron-right"
        color = icons.ACCENT if self.message.metrics.get("status", "ok") == "ok" else icons.WARNING
        self.toggle.setIcon(icons.icon(icon, color))
