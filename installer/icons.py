"""The app's logo (resources/icons/logo.svg) as PNG files for the Linux desktop and an .ico file for Windows (the
executable's icon and the installer's)."""

from __future__ import annotations

import os
from pathlib import Path

_APPS: list = []
LOGO = Path(__file__).resolve().parent.parent / "resources" / "icons" / "logo.svg"


def render_png(size: int, out: Path, svg: Path = LOGO) -> Path:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    if QGuiApplication.instance() is None:
        _APPS.append(QGuiApplication([]))        # QPainter needs one; kept alive here
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    QSvgRenderer(str(svg)).render(painter)
    painter.end()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not image.save(str(out)):
        raise OSError(f"could not write {out}")
    return out


def write_ico(out: Path) -> Path:
    """An .ico with the usual sizes, made by Pillow (an app dependency) from a 256-pixel rendering."""
    from PIL import Image

    png = render_png(256, out.with_suffix(".png"))
    Image.open(png).save(out, sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (128, 128), (256, 256)])
    return out
