"""The look: one calm theme from resources/style.qss, dark, or light where the system asks for light
(Qt's colour scheme hint, read at start; QWENDESK_THEME=dark|light overrides it), plus the palette Qt's
own widgets (rich text links, selections) read.

The style sheet and every colour in the code are written for the dark theme. The light theme is derived
from them, colour by colour (`themed`): greys and dark tints flip their lightness, so each contrast keeps
its order; bright colours (accent, warnings, code) keep their hue at a lightness that reads on a light
background. Pure white is kept: it is the text on the accent."""

from __future__ import annotations

import colorsys
import os
import re

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app.paths import resources_dir

COLORS = {
    "window": "#16171b",
    "surface": "#1e1f24",
    "input": "#24262c",
    "border": "#2f3138",
    "text": "#e4e5e9",
    "muted": "#8b8e98",
    "accent": "#7f95ff",
    "selection": "#34407a",
}
ON_ACCENT = "#ffffff"
HEX = re.compile(r"#[0-9a-fA-F]{6}\b")
FLIP = ((0.0, 1.0), (0.3, 0.83), (0.6, 0.42), (1.0, 0.08))    # dark-theme lightness -> light-theme lightness
scheme = "dark"          # set once by apply_theme, before any widget is drawn


def system_scheme() -> str:
    hints = QGuiApplication.styleHints()
    return "light" if hints.colorScheme() == Qt.ColorScheme.Light else "dark"


def themed(color: str) -> str:
    """A dark-theme colour (#rrggbb) as the current theme draws it."""
    if scheme == "dark" or color.lower() == ON_ACCENT:
        return color
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    hue, light, saturation = colorsys.rgb_to_hls(r, g, b)
    if saturation > 0.35 and light > 0.45:            # a bright colour: the same hue, dark enough to read
        light, saturation = min(light, 0.5), min(saturation, 0.72)
    else:                                              # a grey or a dark tint: flipped
        light = _flipped(light)
    r, g, b = colorsys.hls_to_rgb(hue, light, saturation)
    return "#{:02x}{:02x}{:02x}".format(*(round(v * 255) for v in (r, g, b)))


def _flipped(light: float) -> float:
    """Dark backgrounds become near-white ones, light text dark text; monotonic, so every contrast keeps
    its order (backgrounds 0..0.3 -> 1..0.83, muted greys 0.3..0.6 -> 0.83..0.42, text 0.6..1 -> 0.42..0.08)."""
    for (x0, y0), (x1, y1) in zip(FLIP, FLIP[1:]):
        if light <= x1:
            return y0 + (light - x0) * (y1 - y0) / (x1 - x0)
    return FLIP[-1][1]


def themed_text(text: str) -> str:
    """Every #rrggbb in a style sheet or inline-styled HTML, themed."""
    return text if scheme == "dark" else HEX.sub(lambda m: themed(m.group()), text)


def apply_theme(app: QApplication, chosen: str | None = None) -> None:
    """`chosen`: "dark" or "light"; None follows QWENDESK_THEME, else the system."""
    global scheme
    scheme = chosen or os.environ.get("QWENDESK_THEME") or system_scheme()
    app.setStyle("Fusion")
    palette = QPalette()
    c = {k: QColor(themed(v)) for k, v in COLORS.items()}
    palette.setColor(QPalette.ColorRole.Window, c["window"])
    palette.setColor(QPalette.ColorRole.Base, c["input"])
    palette.setColor(QPalette.ColorRole.AlternateBase, c["surface"])
    palette.setColor(QPalette.ColorRole.Button, c["surface"])
    palette.setColor(QPalette.ColorRole.ToolTipBase, c["surface"])
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText,
                 QPalette.ColorRole.ToolTipText, QPalette.ColorRole.BrightText):
        palette.setColor(role, c["text"])
    palette.setColor(QPalette.ColorRole.PlaceholderText, c["muted"])
    palette.setColor(QPalette.ColorRole.Highlight, c["selection"])
    palette.setColor(QPalette.ColorRole.HighlightedText, c["text"])
    palette.setColor(QPalette.ColorRole.Link, c["accent"])
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, c["muted"])
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, c["muted"])
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, c["muted"])
    app.setPalette(palette)
    font = QFont(app.font())
    font.setPointSizeF(10.5)
    app.setFont(font)
    app.setStyleSheet(themed_text((resources_dir() / "style.qss").read_text(encoding="utf-8")))


def mono_font(point_size: float = 10.0) -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setPointSizeF(point_size)
    return font
