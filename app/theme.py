"""The look: one calm dark theme from resources/style.qss, plus the palette Qt's own
widgets (rich text links, selections) read."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
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


def apply_theme(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = QPalette()
    c = {k: QColor(v) for k, v in COLORS.items()}
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
    app.setStyleSheet((resources_dir() / "style.qss").read_text(encoding="utf-8"))


def mono_font(point_size: float = 10.0) -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setPointSizeF(point_size)
    return font
