"""Small widgets the pages share: labels with a role, icon buttons, banners, separators."""

from __future__ import annotations

from dataclasses import dataclass, fields

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import icons


def label(text: str = "", name: str = "", wrap: bool = False, selectable: bool = False) -> QLabel:
    widget = QLabel(text)
    if name:
        widget.setObjectName(name)
    widget.setWordWrap(wrap)
    if selectable:
        widget.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return widget


def icon_button(icon_name: str, tooltip: str, color: str = icons.MUTED, size: int = 16) -> QToolButton:
    button = QToolButton()
    button.setObjectName("iconButton")
    button.setIcon(icons.icon(icon_name, color))
    button.setIconSize(_size(size))
    button.setToolTip(tooltip)
    button.setAccessibleName(tooltip)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


def text_button(text: str, icon_name: str = "", kind: str = "", color: str = icons.TEXT) -> QPushButton:
    """kind: "" (secondary), "primary" or "danger"; the style sheet draws each."""
    button = QPushButton(text)
    button.setFocusPolicy(Qt.FocusPolicy.TabFocus)      # a click does not leave a focus ring; Tab does
    if kind:
        button.setObjectName(kind)
    if icon_name:
        button.setIcon(icons.icon(icon_name, icons.ON_ACCENT if kind == "primary" else color))
        button.setIconSize(_size(16))
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


def set_enabled(widget: QWidget, enabled: bool, why_not: str, tooltip: str = "") -> None:
    """Enable or disable `widget`; disabled, its tooltip says why in the user's words (and what to do)."""
    widget.setEnabled(enabled)
    widget.setToolTip(tooltip if enabled else why_not)


def layout_widgets(layout: QLayout) -> list[QWidget]:
    """The widgets a layout holds (its spacers and inner layouts left out)."""
    items = (layout.itemAt(i) for i in range(layout.count()))
    return [w for w in (item.widget() if item is not None else None for item in items) if w is not None]


def clear_layout(layout: QLayout) -> None:
    """Everything out of the layout; its widgets hidden at once (deleteLater waits for the event loop: they would be
    drawn over what replaces them meanwhile) and deleted."""
    while layout.count():
        item = layout.takeAt(0)
        widget = item.widget() if item is not None else None
        if widget is not None:
            widget.hide()
            widget.deleteLater()


def _size(px: int):
    from PySide6.QtCore import QSize
    return QSize(px, px)


BANNER_ICONS = {"info": ("info", icons.ACCENT), "warning": ("warning", icons.WARNING),
                "error": ("warning", icons.DANGER)}


class Banner(QFrame):
    """A one-line message with an optional action button: info, warning or error."""
    action_clicked = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 8, 8, 8)
        row.setSpacing(10)
        self.icon = QLabel()
        self.text = label(wrap=True, selectable=True)
        self.text.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.action = text_button("")
        self.action.clicked.connect(self.action_clicked)
        self.close_button = icon_button("close", "Dismiss", size=14)
        self.close_button.clicked.connect(self.hide)
        row.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.text, 1)
        row.addWidget(self.action)
        row.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_message(self, kind: str, text: str, action: str = "", closable: bool = True) -> None:
        name, color = BANNER_ICONS[kind]
        self.setProperty("kind", kind)
        self.style().unpolish(self)
        self.style().polish(self)
        self.icon.setPixmap(icons.pixmap(name, 16, color))
        self.text.setText(text)
        self.action.setText(action)
        self.action.setVisible(bool(action))
        self.close_button.setVisible(closable)
        self.show()


class Card(QFrame):
    """A rounded panel with a vertical layout."""

    def __init__(self, parent=None, margins=(16, 14, 16, 14), spacing: int = 8):
        super().__init__(parent)
        self.setObjectName("card")
        self.body = QVBoxLayout(self)
        self.body.setContentsMargins(*margins)
        self.body.setSpacing(spacing)


@dataclass
class SamplingBoxes:
    """The generation settings' input boxes, one per SamplingParams field, with their ranges (the Settings page's
    defaults and a conversation's own options)."""
    temperature: QDoubleSpinBox
    top_p: QDoubleSpinBox
    top_k: QSpinBox
    min_p: QDoubleSpinBox
    presence_penalty: QDoubleSpinBox
    max_tokens: QSpinBox

    def by_field(self) -> dict[str, QSpinBox | QDoubleSpinBox]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def sampling_boxes() -> SamplingBoxes:
    def decimal(low: float, high: float, step: float) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(low, high)
        box.setSingleStep(step)
        box.setDecimals(2)
        return box

    def whole(low: int, high: int, step: int) -> QSpinBox:
        box = QSpinBox()
        box.setRange(low, high)
        box.setSingleStep(step)
        return box

    boxes = SamplingBoxes(temperature=decimal(0, 2, 0.05), top_p=decimal(0.01, 1, 0.01), top_k=whole(0, 1000, 1),
                          min_p=decimal(0, 1, 0.01), presence_penalty=decimal(-2, 2, 0.1),
                          max_tokens=whole(16, 262_144, 1024))
    boxes.top_k.setSpecialValueText("Off")
    return boxes


def scrolling_page(page: QWidget, max_width: int) -> QVBoxLayout:
    """Give `page` a vertical scroll area with a centred column; returns the column's layout."""
    scroll = QScrollArea()
    scroll.setObjectName("pageScroll")
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    canvas = QWidget()
    canvas.setObjectName("pageCanvas")
    outer = QHBoxLayout(canvas)
    outer.setContentsMargins(32, 24, 32, 32)
    column_widget = QWidget()
    column_widget.setMaximumWidth(max_width)
    column = QVBoxLayout(column_widget)
    column.setContentsMargins(0, 0, 0, 0)
    column.setSpacing(14)
    outer.addStretch(1)
    outer.addWidget(column_widget, 100)
    outer.addStretch(1)
    scroll.setWidget(canvas)
    layout = QVBoxLayout(page)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(scroll)
    return column


class Form(QGridLayout):
    """Label and field rows, both centred on the row (QFormLayout puts labels a little high)."""

    def __init__(self):
        super().__init__()
        self.setHorizontalSpacing(18)
        self.setVerticalSpacing(10)
        self.setColumnMinimumWidth(0, 140)
        self.setColumnStretch(2, 1)

    def addRow(self, text: str, field, top: bool = False) -> None:
        row = self.rowCount()
        align = Qt.AlignmentFlag.AlignLeft | (Qt.AlignmentFlag.AlignTop if top else Qt.AlignmentFlag.AlignVCenter)
        self.addWidget(label(text, "formLabel"), row, 0, align)
        if isinstance(field, QWidget):
            self.addWidget(field, row, 1, Qt.AlignmentFlag.AlignVCenter)
        else:
            self.addLayout(field, row, 1)


def page_header(title: str, subtitle: str = "") -> QWidget:
    header = QWidget()
    column = QVBoxLayout(header)
    column.setContentsMargins(0, 0, 0, 0)
    column.setSpacing(2)
    column.addWidget(label(title, "pageTitle"))
    if subtitle:
        column.addWidget(label(subtitle, "muted", wrap=True))
    return header


class ElidedLabel(QLabel):
    """One line that ends in "…" when it does not fit."""

    def __init__(self, text: str = "", name: str = "", mode=Qt.TextElideMode.ElideRight):
        super().__init__()
        if name:
            self.setObjectName(name)
        self.mode = mode
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.full_text = ""
        self.setText(text)

    def setText(self, text: str) -> None:
        self.full_text = text
        self.setToolTip(text)
        self._elide()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        super().setText(self.fontMetrics().elidedText(self.full_text, self.mode, self.width()))
