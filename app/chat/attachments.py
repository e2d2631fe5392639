"""Images waiting to be sent: thumbnails above the composer, each with a remove button.
Picked, pasted and dropped images are kept in the app's attachments folder (beside the conversation
database), once per content: the file is named by its sha256, and messages refer to it by path, so an
edit, a regenerate or a reopened conversation sends the same bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QWidget

from app.paths import attachments_dir
from app.widgets import icon_button

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
THUMB = 56


def is_image_file(path: str) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def keep_bytes(data: bytes, suffix: str) -> str:
    """The stored copy of an encoded image: <sha256><suffix> in the attachments folder, written once."""
    target = attachments_dir() / f"{hashlib.sha256(data).hexdigest()}{suffix}"
    if not target.is_file():
        partial = target.with_suffix(target.suffix + ".part")
        partial.write_bytes(data)
        partial.replace(target)
    return str(target)


def keep_image_file(path: str) -> str:
    return keep_bytes(Path(path).read_bytes(), Path(path).suffix.lower())


def keep_image(image: QImage) -> str:
    """A pasted image, encoded as PNG."""
    encoded = QByteArray()
    buffer = QBuffer(encoded)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return keep_bytes(bytes(encoded), ".png")


def square_thumbnail(path: str, side: int) -> QPixmap:
    """The image scaled to cover a square, cut from its centre."""
    scaled = QPixmap(path).scaled(side, side, Qt.AspectRatioMode.KeepAspectRatioByExpanding,
                                  Qt.TransformationMode.SmoothTransformation)
    return scaled.copy((scaled.width() - side) // 2, (scaled.height() - side) // 2, side, side)


class AttachmentStrip(QWidget):
    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(8)
        self.row.addStretch(1)
        self.paths: list[str] = []
        self.hide()

    def add(self, path: str) -> None:
        self.paths.append(path)
        tile = QFrame()
        tile.setObjectName("attachmentTile")
        tile.setFixedSize(THUMB + 8, THUMB + 8)
        image = QLabel(tile)
        image.setGeometry(4, 4, THUMB, THUMB)
        image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        image.setPixmap(square_thumbnail(path, THUMB))
        remove = icon_button("close", "Remove image", size=12)
        remove.setObjectName("attachmentRemove")
        remove.setParent(tile)
        remove.setGeometry(THUMB - 14, 0, 22, 22)
        remove.clicked.connect(lambda: self._remove(path, tile))
        tile.setToolTip(Path(path).name)
        self.row.insertWidget(self.row.count() - 1, tile)
        self.show()
        self.changed.emit()

    def take(self) -> list[str]:
        paths = list(self.paths)
        self.clear()
        return paths

    def clear(self) -> None:
        while self.row.count() > 1:
            item = self.row.takeAt(0)
            item.widget().deleteLater()
        self.paths.clear()
        self.hide()
        self.changed.emit()

    def _remove(self, path: str, tile: QWidget) -> None:
        self.paths.remove(path)
        self.row.removeWidget(tile)
        tile.deleteLater()
        self.setVisible(bool(self.paths))
        self.changed.emit()
