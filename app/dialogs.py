"""Modal questions, in one place so tests can answer them."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget


def confirm(parent: QWidget, title: str, text: str, action: str, keep: str = "Cancel") -> bool:
    """True when the user picks `action` (drawn as destructive); `keep`, the default, says what not doing it is."""
    box = QMessageBox(QMessageBox.Icon.Question, title, text, QMessageBox.StandardButton.Cancel, parent)
    box.button(QMessageBox.StandardButton.Cancel).setText(keep)
    ok = box.addButton(action, QMessageBox.ButtonRole.DestructiveRole)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is ok


def inform(parent: QWidget, title: str, text: str) -> None:
    QMessageBox.information(parent, title, text)


def save_path(parent: QWidget, title: str, suggested: str, filter_: str) -> str:
    """A file to write, or "" when the user cancels."""
    return QFileDialog.getSaveFileName(parent, title, suggested, filter_)[0]


def open_path(parent: QWidget, title: str, filter_: str) -> str:
    """A file to read, or "" when the user cancels."""
    return QFileDialog.getOpenFileName(parent, title, "", filter_)[0]
