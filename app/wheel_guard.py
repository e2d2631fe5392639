"""Drop-downs and number boxes ignore the mouse wheel unless they have the keyboard focus: a wheel over a
settings page scrolls the page, never changes an engine setting the pointer happens to pass over."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QApplication, QComboBox


class WheelGuard(QObject):
    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Type.Wheel and isinstance(watched, (QComboBox, QAbstractSpinBox)):
            if watched.focusPolicy() == Qt.FocusPolicy.WheelFocus:
                watched.setFocusPolicy(Qt.FocusPolicy.StrongFocus)   # the wheel must not give the focus either
            if not watched.hasFocus():
                area = watched.parentWidget()
                while area is not None and not isinstance(area, QAbstractScrollArea):
                    area = area.parentWidget()
                if area is not None:        # the page's scroll area scrolls instead
                    QApplication.sendEvent(area.viewport(), event)
                return True
        return False


def guard_wheel() -> None:
    """Install the guard on the application, once."""
    app = QApplication.instance()
    if app is not None and app.findChild(WheelGuard) is None:
        app.installEventFilter(WheelGuard(app))
