"""The conversation list: new chat, search, rename (F2 / double-click / menu), delete."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QVBoxLayout,
)

from app import icons
from app.store import Conversation
from app.widgets import text_button

ID_ROLE = Qt.ItemDataRole.UserRole


class ConversationList(QFrame):
    selected = Signal(int)
    new_requested = Signal()
    renamed = Signal(int, str)
    delete_requested = Signal(int)
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
        column.addWidget(self.new_button)
        column.addWidget(self.search)
        column.addWidget(self.list, 1)
        self._filling = False

    def set_conversations(self, conversations: list[Conversation], current: int | None) -> None:
        self._filling = True
        self.list.clear()
        for c in conversations:
            item = QListWidgetItem(c.title)
            item.setData(ID_ROLE, c.id)
            item.setToolTip(c.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if c.id == current:
                self.list.setCurrentItem(item)
        if current is None:
            self.list.clearSelection()
            self.list.setCurrentRow(-1)
        self._filling = False

    def _on_clicked(self, item: QListWidgetItem) -> None:
        self.selected.emit(item.data(ID_ROLE))

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if not self._filling and item.text().strip():
            self.renamed.emit(item.data(ID_ROLE), item.text().strip())

    def _delete_current(self) -> None:
        item = self.list.currentItem()
        if item:
            self.delete_requested.emit(item.data(ID_ROLE))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        menu = QMenu(self)
        menu.addAction(icons.icon("edit"), "Rename", lambda: self.list.editItem(item))
        menu.addAction(icons.icon("trash", icons.DANGER), "Delete",
                       lambda: self.delete_requested.emit(item.data(ID_ROLE)))
        menu.exec(self.list.viewport().mapToGlobal(pos))
