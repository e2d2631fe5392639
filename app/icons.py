"""Icons: the SVGs in resources/icons, drawn in one colour at any size.

The SVGs are stroked in black; `icon()` swaps that colour before rendering so one drawing
serves every state (normal, accent, muted).
"""

from __future__ import annotations

from functools import cache

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from app.paths import resources_dir
from app.theme import themed

TEXT = "#d7d9de"
MUTED = "#8b8e98"
ACCENT = "#8ea2ff"
ON_ACCENT = "#ffffff"
DANGER = "#ef7a7a"
WARNING = "#e5b454"


@cache
def _svg(name: str) -> str:
    return (resources_dir() / "icons" / f"{name}.svg").read_text(encoding="utf-8")


def pixmap(name: str, size: int = 18, color: str = TEXT, scale: float = 2.0) -> QPixmap:
    data = _svg(name).replace("#000000", themed(color))
    renderer = QSvgRenderer(QByteArray(data.encode()))
    side = int(size * scale)
    image = QPixmap(side, side)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter, QRectF(0, 0, side, side))
    painter.end()
    image.setDevicePixelRatio(scale)
    return image


@cache
def icon(name: str, color: str = TEXT, active: str | None = None) -> QIcon:
    """`active`: the colour when the button is checked (navigation)."""
    result = QIcon()
    for size in (16, 18, 20, 24):
        result.addPixmap(pixmap(name, size, color), QIcon.Mode.Normal, QIcon.State.Off)
        result.addPixmap(pixmap(name, size, active or color), QIcon.Mode.Normal, QIcon.State.On)
        result.addPixmap(pixmap(name, size, MUTED), QIcon.Mode.Disabled, QIcon.State.Off)
    return result


def app_icon() -> QIcon:
    return QIcon(str(resources_dir() / "icons" / "logo.svg"))
