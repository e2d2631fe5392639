"""Switch: an on/off toggle drawn as a track and a knob (a QCheckBox underneath: toggled, isChecked, setChecked
and keyboard focus work as usual), for settings that switch something on at once."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QCheckBox

from app import icons
from app.theme import themed

TRACK_W, TRACK_H, GAP = 36, 20, 10


class Switch(QCheckBox):
    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setCursor(Qt.CursorShape.PointingHandCursor)

    def sizeHint(self) -> QSize:
        text = self.fontMetrics().horizontalAdvance(self.text())
        return QSize(TRACK_W + (GAP + text if text else 0) + 2, max(TRACK_H, self.fontMetrics().height()) + 4)

    def hitButton(self, pos) -> bool:
        return self.rect().contains(pos)

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        top = (self.height() - TRACK_H) / 2
        track = QRectF(1, top, TRACK_W, TRACK_H)
        on, enabled = self.isChecked(), self.isEnabled()
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor(themed(icons.ACCENT if on else "#3a3d45" if enabled else "#2a2c33")))
        p.drawRoundedRect(track, TRACK_H / 2, TRACK_H / 2)
        knob = TRACK_H - 6
        x = track.right() - knob - 3 if on else track.left() + 3
        p.setBrush(QColor(themed("#ffffff" if enabled else "#6b6f7a")))
        p.drawEllipse(QRectF(x, top + 3, knob, knob))
        if self.hasFocus():
            p.setPen(QColor(themed(icons.ACCENT)))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(track.adjusted(-1, -1, 1, 1), TRACK_H / 2 + 1, TRACK_H / 2 + 1)
        if self.text():
            p.setPen(self.palette().color(self.foregroundRole()) if enabled else QColor(themed(icons.MUTED)))
            p.drawText(QRectF(TRACK_W + GAP, 0, self.width() - TRACK_W - GAP, self.height()),
                       Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, self.text())
        p.end()
