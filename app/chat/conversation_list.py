"""The conversation list: new chat, import, search, rename (F2 / double-click / menu), pin, export, delete; pinned ones
first, the others grouped under when each was last active (Today, Yesterday, Previous 7 days, then
months), long titles elided."""

from __future__ import annotations

import datetime as dt

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QColor, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QVBoxLayout,
)

from app import icons
from app.store import Conversation
from app.theme import themed
from app.widgets import icon_button, text_button

ID_ROLE = Qt.ItemDataRole.UserRole
PINNED_ROLE = Qt.ItemDataRole.UserRole + 1
PINNED = "Pinned"


def age_group(updated: float, today: dt.date | None = None) -> str:
    """The heading a conversation last active at `updated` (epoch seconds) goes under."""
    today = today or dt.date.today()
    day = dt.datetime.fromtimestamp(updated).date()
    days = (today - day).days
    if days <= 0:
        return "Today"
    if days == 1:
        return "Yesterday"
    if days < 7:
        return "Previous 7 days"
    return day.strftime("%B %Y") if day.year != today.year else day.strftime("%B")


class ConversationList(QFrame):
    selected = Signal(int)
    new_requested = Signal()
    renamed = Signal(int, str)
    delete_requested = Signal(int)
    pin_requested = Signal(int, bool)
    export_requested = Signal(int, str)       # conversation id, "markdown" | "json"
    import_requested = Signal()
    search_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sidePanel")
        self.setFixedWidth(260)
        column = QVBoxLayout(self)
        column.setContentsMargins(12, 14, 12, 12)
        column.setSpacing(10)
        self.new_button = text_button("New chat", "plus", "primary")
        self.new_button.clicked.connect(self.new_requested)
        self.import_button = icon_button("folder", "Import a conversation from a JSON file")
        self.import_button.clicked.connect(self.import_requested)
        self.search = QLineEdit()
        self.search.setObjectName("search")
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.addAction(icons.icon("search", icons.MUTED), QLineEdit.ActionPosition.LeadingPosition)
        self.search.textChanged.connect(self.search_changed)
        self.list = QListWidget()
        self.list.setObjectName("conversationList")
        self.list.setFrameShape(QFrame.Shape.NoFrame)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.itemClicked.connect(self._on_clicked)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.setEditTriggers(QListWidget.EditTrigger.DoubleClicked | QListWidget.EditTrigger.EditKeyPressed)
        delete = QAction(self.list)
        delete.setShortcut(QKeySequence.StandardKey.Delete)
        delete.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        delete.triggered.connect(self._delete_current)
        self.list.addAction(delete)
        top = QHBoxLayout()
        top.setSpacing(6)
        top.addWidget(self.new_button, 1)
        top.addWidget(self.import_button)
        column.addLayout(top)
        column.addWidget(self.search)
        column.addWidget(self.list, 1)
        self._filling = False

    def set_conversations(self, conversations: list[Conversation], current: int | None) -> None:
        self._filling = True
        self.list.clear()
        group = None
        for c in conversations:
            if (PINNED if c.pinned else age_group(c.updated)) != group:
                group = PINNED if c.pinned else age_group(c.updated)
                heading = QListWidgetItem(group)
                heading.setFlags(Qt.ItemFlag.NoItemFlags)
                heading.setForeground(QColor(themed(icons.MUTED)))
                font = heading.font()
                font.setPointSizeF(font.pointSizeF() * 0.85)
                heading.setFont(font)
                self.list.addItem(heading)
            item = QListWidgetItem(c.title)
            item.setData(ID_ROLE, c.id)
            item.setData(PINNED_ROLE, c.pinned)
            item.setToolTip(f"{c.title}\nLast active {dt.datetime.fromtimestamp(c.updated):%d %b %Y, %H:%M}")
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if c.id == current:
                self.list.setCurrentItem(item)
        if current is None:
            self.list.clearSelection()
            self.list.setCurrentRow(-1)
        self._filling = False

    def items(self) -> list[QListWidgetItem]:
        """The conversations' rows (not the headings)."""
        return [self.list.item(i) for i in range(self.list.count()) if self.list.item(i).data(ID_ROLE) is not None]

    def _on_clicked(self, item: QListWidgetItem) -> None:
        if item.data(ID_ROLE) is not None:
            self.selected.emit(item.data(ID_ROLE))

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if not self._filling and item.text().strip():
            self.renamed.emit(item.data(ID_ROLE), item.text().strip())

    def _delete_current(self) -> None:
        item = self.list.currentItem()
        if item and item.data(ID_ROLE) is not None:
            self.delete_requested.emit(item.data(ID_ROLE))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None or item.data(ID_ROLE) is None:
            return
        menu = QMenu(self)
        menu.addAction(icons.icon("edit"), "Rename", lambda: self.list.editItem(item))
        pinned = bool(item.data(PINNED_ROLE))
        menu.addAction(icons.icon("pin"), "Unpin" if pinned else "Pin to the top",
                       lambda: self.pin_requested.emit(item.data(ID_ROLE), not pinned))
        menu.addAction(icons.icon("download"), "Export as Markdown…",
                       lambda: self.export_requested.emit(item.data(ID_ROLE), "markdown"))
        menu.addAction(icons.icon("download"), "Export as JSON…",
                       lambda: self.export_requested.emit(item.data(ID_ROLE), "json"))
        menu.addAction(icons.icon("trash", icons.DANGER), "Delete",
                       lambda: self.delete_requested.emit(item.data(ID_ROLE)))
        menu.exec(self.list.viewport().mapToGlobal(pos))
