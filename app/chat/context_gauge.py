"""How much of the context the conversation uses: "1.2K / 32K" and a thin bar."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QWidget

from app.formatting import human_tokens
from app.widgets import label


class ContextGauge(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(8)
        self.text = label("", "gaugeText")
        self.bar = QProgressBar()
        self.bar.setObjectName("contextBar")
        self.bar.setTextVisible(False)
        self.bar.setFixedSize(90, 6)
        self.bar.setRange(0, 1000)
        row.addWidget(self.text)
        row.addWidget(self.bar)
        self.used, self.total = 0, None
        self.set_usage(0, None)

    def set_usage(self, used: int, total: int | None) -> None:
        self.used, self.total = used, total
        if not total:
            self.text.setText(f"{human_tokens(used)} tokens" if used else "")
            self.bar.hide()
            self.setToolTip("")
            return
        share = min(1.0, used / total)
        self.text.setText(f"{human_tokens(used)} / {human_tokens(total)}")
        self.bar.show()
        self.bar.setValue(int(share * 1000))
        self.bar.setProperty("level", "high" if share > 0.9 else "mid" if share > 0.7 else "low")
        self.bar.style().unpolish(self.bar)
        self.bar.style().polish(self.bar)
        self.setToolTip(f"The conversation uses {used:,} of {total:,} tokens of context ({share:.0%}).")
