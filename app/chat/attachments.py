"""Images waiting to be sent: thumbnails above the composer, each with a remove button.
Picked, pasted and dropped images are decoded by the engine's own reader when attached (a file that is not an
image it reads is refused then, by its name), and kept in the app's attachments folder (beside the conversation
database), once per content: `<sha256>/<the file's own name>`; messages refer to it by path, so an edit, a
regenerate or a reopened conversation sends the same bytes, and the transcript shows the file's name."""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QWidget

from app.paths import attachments_dir
from app.widgets import icon_button
from engine.api import ImageInputError, decode_image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
THUMB = 56


def is_image_file(path: str) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


class AttachmentError(ValueError):
    """A file that cannot be attached; the message names it."""


def safe_name(name: str) -> str:
    """A file name to store under: the last path part, no control or path characters, at most 120 characters."""
    name = re.sub(r'[\x00-\x1f\x7f/\\:*?"<>|]', "_", name.replace("\\", "/").rsplit("/", 1)[-1]).strip(" .")
    stem, dot, suffix = name.rpartition(".")
    return (f"{stem[:100]}.{suffix[:16]}" if dot and stem else name[:120]) or "image"


def keep_bytes(data: bytes, name: str) -> str:
    """The stored copy of an encoded image: <sha256>/<name> in the attachments folder, written once. `name` is the
    file's own name (a bare suffix, ".png", as exports carry it, is stored as image.png)."""
    name = safe_name(f"image{name}" if name.startswith(".") else name)
    target = attachments_dir() / hashlib.sha256(data).hexdigest() / name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(data)
        partial.replace(target)
    return str(target)


def keep_image_file(path: str) -> str:
    """A picked or dropped file, checked first: AttachmentError names it when it cannot be read as an image."""
    name = Path(path).name
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise AttachmentError(f"{name} cannot be attached: {e.strerror or e}") from None
    try:
        decode_image(data)
    except ImageInputError as e:
        raise AttachmentError(f"{name} cannot be attached: {e}") from None
    return keep_bytes(data, name)


def keep_image(image: QImage) -> str:
    """A pasted image, encoded as PNG."""
    encoded = QByteArray()
    buffer = QBuffer(encoded)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")  # type: ignore[call-overload]  # PySide6's stub says bytes; the call takes only a str
    return keep_bytes(bytes(encoded.data()), "pasted image.png")


def image_problem(path: str) -> str:
    """Why a stored image cannot be sent ("" when it can): gone, or not readable by the engine."""
    try:
        return _problem(path, Path(path).stat().st_mtime_ns)
    except OSError:
        return "the file is gone"


@lru_cache(maxsize=256)
def _problem(path: str, mtime_ns: int) -> str:
    try:
        decode_image(Path(path).read_bytes())
    except OSError as e:
        return str(e.strerror or e)
    except ImageInputError as e:
        return str(e)
    return ""


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
        remove.setToolTip(f"Remove {Path(path).name}")
        remove.setAccessibleName(f"Remove {Path(path).name}")
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
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.paths.clear()
        self.hide()
        self.changed.emit()

    def _remove(self, path: str, tile: QWidget) -> None:
        self.paths.remove(path)
        self.row.removeWidget(tile)
        tile.deleteLater()
        self.setVisible(bool(self.paths))
        self.changed.emit()
