"""An image of the transcript at full size: a thumbnail that opens a viewer when clicked."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QPixmap
from PySide6.QtWidgets import QDialog, QLabel, QScrollArea, QVBoxLayout

from app.chat.attachments import image_problem


class Thumbnail(QLabel):
    clicked = Signal(str)

    def __init__(self, path: str, side: int, parent=None):
        super().__init__(parent)
        self.path = path
        self.setObjectName("thumbnail")
        name = Path(path).name
        self.problem = image_problem(path)
        image = QPixmap() if self.problem else QPixmap(path)
        if self.problem or image.isNull():
            self.setObjectName("thumbnailProblem")
            self.setWordWrap(True)
            self.setMaximumWidth(side * 4)
            self.setText(f"⚠ {name}: {self.problem or 'cannot be shown'}. Left out of the conversation.")
            self.setToolTip(self.text())
        else:
            self.setPixmap(image.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                        Qt.TransformationMode.SmoothTransformation))
            self.setCursor(Qt.CursorShape.PointingHandCursor)
            self.setToolTip(f"{name}: click to view")
        self.setAccessibleName(name)
        self.clicked.connect(lambda p: open_viewer(p, self.window()))

    def mouseReleaseEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton and self.pixmap() and not self.pixmap().isNull():
            self.clicked.emit(self.path)
        super().mouseReleaseEvent(event)


class ImageViewer(QDialog):
    """The image at its own size, scaled down to fit the screen; Esc closes."""

    def __init__(self, path: str, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Image")
        image = QPixmap(path)
        screen = QGuiApplication.primaryScreen().availableSize()
        if image.width() > screen.width() * 0.9 or image.height() > screen.height() * 0.85:
            image = image.scaled(int(screen.width() * 0.9), int(screen.height() * 0.85),
                                 Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
        self.image = QLabel()
        self.image.setPixmap(image)
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        scroll = QScrollArea()
        scroll.setWidget(self.image)
        scroll.setWidgetResizable(True)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(scroll)
        self.resize(image.width() + 4, image.height() + 4)


def open_viewer(path: str, parent=None) -> ImageViewer:
    viewer = ImageViewer(path, parent)
    viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    viewer.show()
    return viewer
