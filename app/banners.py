"""Banners, stacked: each message stays until dismissed, the newest on top, so a second message does not
overwrite the first. The same text again moves its banner to the top instead of repeating it; past
MAX_SHOWN the oldest goes."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.widgets import Banner

MAX_SHOWN = 3


class BannerStack(QWidget):
    action_clicked = Signal(str)          # the action's text, of whichever banner offered it

    def __init__(self, parent=None):
        super().__init__(parent)
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(6)
        self.banners: list[Banner] = []   # newest first
        self.hide()

    def show_message(self, kind: str, text: str, action: str = "") -> Banner:
        for old in [b for b in self.banners if b.text.text() == text]:
            self._remove(old)
        banner = Banner(self)
        banner.action_clicked.connect(lambda: self.action_clicked.emit(action))
        banner.close_button.clicked.disconnect()
        banner.close_button.clicked.connect(lambda: self._remove(banner))
        self.banners.insert(0, banner)
        self.column.insertWidget(0, banner)
        banner.show_message(kind, text, action)
        for old in self.banners[MAX_SHOWN:]:
            self._remove(old)
        self.show()
        return banner

    def texts(self) -> list[str]:
        return [b.text.text() for b in self.banners]

    def latest(self) -> Banner | None:
        return self.banners[0] if self.banners else None

    def remove_text(self, text: str) -> None:
        for banner in [b for b in self.banners if b.text.text() == text]:
            self._remove(banner)

    def clear(self) -> None:
        for banner in list(self.banners):
            self._remove(banner)

    def _remove(self, banner: Banner) -> None:
        if banner in self.banners:
            self.banners.remove(banner)
            self.column.removeWidget(banner)
            banner.deleteLater()
        self.setVisible(bool(self.banners))
