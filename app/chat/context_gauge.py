"""How much of the context the conversation uses: "1.2K / 32K" and a thin bar (it follows a reply as it
streams), and how many of the oldest messages the model no longer sees."""

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
        self.left_out_text = label("", "gaugeLeftOut")
        row.addWidget(self.left_out_text)
        self.used, self.total, self.left_out = 0, None, 0
        self.set_usage(0, None)

    def set_usage(self, used: int, total: int | None, left_out: int = 0) -> None:
        self.used, self.total, self.left_out = used, total, left_out
        self.left_out_text.setText(f"{left_out} oldest left out" if left_out else "")
        self.left_out_text.setVisible(bool(left_out))
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
        tip = f"The conversation uses {used:,} of {total:,} tokens of context ({share:.0%})."
        if left_out:
            tip += f" To fit, the model no longer sees its {left_out} oldest messages (they stay here)."
        self.setToolTip(tip)
