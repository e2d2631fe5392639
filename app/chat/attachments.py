"""Images waiting to be sent: thumbnails above the composer, each with a remove button.
Pasted and dropped images are copied into the app's attachments folder so the conversation
keeps them."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QWidget

from app.paths import attachments_dir
from app.widgets import icon_button

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
THUMB = 56


def is_image_file(path: str) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def keep_image_file(path: str) -> str:
    target = attachments_dir() / f"{uuid.uuid4().hex}{Path(path).suffix.lower()}"
    shutil.copyfile(path, target)
    return str(target)


def keep_image(image: QImage) -> str:
    target = attachments_dir() / f"{uuid.uuid4().hex}.png"
    image.save(str(target), "PNG")
    return str(target)


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
