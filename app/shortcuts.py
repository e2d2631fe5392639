"""The keyboard shortcuts, listed once: the window and the chat page register theirs from here, and the shortcut
sheet (F1 or Ctrl+/) shows them all."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QGridLayout, QLabel, QVBoxLayout

# action -> (keys, what they do); the window and the chat page bind the first group, the rest are the widgets' own
SHORTCUTS = {
    "chat": ("Ctrl+1", "Chat, with the cursor in the message box"),
    "models": ("Ctrl+2", "Models"),
    "settings": ("Ctrl+3", "Settings"),
    "new_chat": ("Ctrl+N", "New chat, with the cursor in the message box"),
    "search": ("Ctrl+K", "Search the conversations"),
    "sidebar": ("Ctrl+B", "Show or hide the conversation list"),
    "escape": ("Esc", "Stop the reply, or stop editing"),
    "help": ("F1", "This list (also Ctrl+/)"),
}
HELP_KEYS = ("F1", "Ctrl+/")
WIDGET_KEYS = (
    ("Enter", "Send the message"),
    ("Shift+Enter", "New line in the message"),
    ("Up", "Edit the last message (in an empty message box)"),
    ("Delete", "Delete the selected conversation (in the list)"),
    ("Tab / Shift+Tab", "Move between controls"),
)


def keys(action: str) -> str:
    return SHORTCUTS[action][0]


class ShortcutSheet(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        column = QVBoxLayout(self)
        column.setContentsMargins(20, 18, 20, 14)
        grid = QGridLayout()
        grid.setHorizontalSpacing(24)
        grid.setVerticalSpacing(8)
        rows = [v for v in SHORTCUTS.values()] + list(WIDGET_KEYS)
        for row, (combo, what) in enumerate(rows):
            key = QLabel(combo)
            key.setObjectName("shortcutKeys")
            grid.addWidget(key, row, 0, Qt.AlignmentFlag.AlignLeft)
            grid.addWidget(QLabel(what), row, 1)
        self.rows = rows
        column.addLayout(grid)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        column.addWidget(close)
