"""Modal questions, in one place so tests can answer them."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app import icons


def confirm(parent: QWidget, title: str, text: str, action: str, keep: str = "Cancel") -> bool:
    """True when the user picks `action` (drawn as destructive); `keep`, the default, says what not doing it is.
    The app's own warning glyph and plain buttons: a standard Cancel renamed Keep kept the style's red ✗."""
    box = _box(parent, title, text, "warning", icons.WARNING)
    kept = box.addButton(keep, QMessageBox.ButtonRole.RejectRole)
    ok = box.addButton(action, QMessageBox.ButtonRole.DestructiveRole)
    box.setDefaultButton(kept)
    box.setEscapeButton(kept)
    box.exec()
    return box.clickedButton() is ok


def inform(parent: QWidget, title: str, text: str) -> None:
    box = _box(parent, title, text, "info", icons.ACCENT)
    box.setDefaultButton(box.addButton("OK", QMessageBox.ButtonRole.AcceptRole))
    box.exec()


def _box(parent: QWidget, title: str, text: str, glyph: str, color: str) -> QMessageBox:
    box = QMessageBox(parent)
    box.setWindowTitle(title)
    box.setText(text)
    box.setIconPixmap(icons.pixmap(glyph, 32, color))
    return box


def save_path(parent: QWidget, title: str, suggested: str, filter_: str) -> str:
    """A file to write, or "" when the user cancels."""
    return QFileDialog.getSaveFileName(parent, title, suggested, filter_)[0]


def open_path(parent: QWidget, title: str, filter_: str) -> str:
    """A file to read, or "" when the user cancels."""
    return QFileDialog.getOpenFileName(parent, title, "", filter_)[0]


def folder_path(parent: QWidget, title: str) -> str:
    """A folder, or "" when the user cancels."""
    return QFileDialog.getExistingDirectory(parent, title)
