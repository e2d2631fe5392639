"""The composer: Enter sends, Shift+Enter starts a new line; images arrive by drop, paste or the
file picker; the send button turns into Stop while a reply streams. Under the text, the draft's token
count (the page counts it when typing pauses)."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QPlainTextEdit,
    QToolButton,
    QVBoxLayout,
)

from app import icons
from app.chat.attachments import (
    AttachmentError,
    AttachmentStrip,
    is_image_file,
    keep_image,
    keep_image_file,
)
from app.widgets import icon_button, label, set_enabled

MAX_LINES = 10
PLACEHOLDER = "Message the model"
KEYS_HINT = "  (Enter to send, Shift+Enter for a new line)"
NO_IMAGES = "The model in use does not take images, so images cannot be attached."


def takes_drop(data) -> bool:
    return data.hasUrls() or data.hasImage()


class ComposerEdit(QPlainTextEdit):
    submit = Signal()
    edit_last = Signal()              # Up in an empty composer: edit the last message sent
    image_pasted = Signal(str)        # kept image path
    images_refused = Signal()         # an image dropped or pasted while the model takes none
    attachment_refused = Signal(str)  # a file that is not an image the engine reads: why, with its name
    images_allowed = True

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setTabChangesFocus(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.document().contentsChanged.connect(self._fit_height)
        self._fit_height()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier):
            self.submit.emit()
            return
        if event.key() == Qt.Key.Key_Up and not event.modifiers() and not self.toPlainText():
            self.edit_last.emit()
            return
        super().keyPressEvent(event)

    def focusInEvent(self, event) -> None:
        super().focusInEvent(event)
        self._mark_frame(True)

    def focusOutEvent(self, event) -> None:
        super().focusOutEvent(event)
        self._mark_frame(False)

    def _mark_frame(self, focused: bool) -> None:
        """The composer's frame shows the focus (a style sheet cannot ask whether a child has it)."""
        frame = self.parentWidget()
        while frame is not None and frame.objectName() != "composer":
            frame = frame.parentWidget()
        if frame is not None:
            frame.setProperty("focused", focused)
            frame.style().unpolish(frame)
            frame.style().polish(frame)

    def canInsertFromMimeData(self, source) -> bool:
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source) -> None:
        if (source.hasImage() or any(is_image_file(u.toLocalFile()) for u in source.urls() if u.isLocalFile())) \
                and not self.images_allowed:
            self.images_refused.emit()
            return
        if source.hasImage():
            self.image_pasted.emit(keep_image(source.imageData()))
            return
        images = [u.toLocalFile() for u in source.urls() if u.isLocalFile() and is_image_file(u.toLocalFile())]
        if images:
            for path in images:
                try:
                    self.image_pasted.emit(keep_image_file(path))
                except AttachmentError as e:
                    self.attachment_refused.emit(str(e))
            return
        super().insertFromMimeData(source)

    def resizeEvent(self, event) -> None:
        """The keys hint only where it fits on the line."""
        super().resizeEvent(event)
        full = PLACEHOLDER + KEYS_HINT
        fits = self.fontMetrics().horizontalAdvance(full) + 24 < self.viewport().width()
        self.setPlaceholderText(full if fits else PLACEHOLDER)

    def _fit_height(self) -> None:
        lines = max(1, min(MAX_LINES, int(self.document().size().height())))
        line = self.fontMetrics().lineSpacing()
        self.setFixedHeight(lines * line + 14)


class Composer(QFrame):
    send_requested = Signal(str, list)     # text, image paths
    stop_requested = Signal()
    cancel_edit_requested = Signal()
    edit_last_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("composer")
        self.setAcceptDrops(True)
        column = QVBoxLayout(self)
        column.setContentsMargins(14, 10, 10, 10)
        column.setSpacing(8)
        self.edit_banner = QFrame()
        self.edit_banner.setObjectName("editBanner")
        banner_row = QHBoxLayout(self.edit_banner)
        banner_row.setContentsMargins(0, 0, 0, 0)
        banner_row.addWidget(label("Editing your last message: sending replaces it and its reply.", "muted"))
        banner_row.addStretch(1)
        cancel_edit = icon_button("close", "Cancel editing", size=14)
        cancel_edit.clicked.connect(self.cancel_edit_requested)
        banner_row.addWidget(cancel_edit)
        self.edit_banner.hide()
        self.attachments = AttachmentStrip()
        self.note = label("", "composerNote", wrap=True)
        self.note.hide()
        self.input = ComposerEdit()
        self.input.submit.connect(self._submit)
        self.input.edit_last.connect(self.edit_last_requested)
        self.input.image_pasted.connect(self.attachments.add)
        self.input.images_refused.connect(lambda: self._show_note(NO_IMAGES))
        self.input.attachment_refused.connect(self._show_note)
        tools = QHBoxLayout()
        tools.setSpacing(6)
        self.attach_button = icon_button("attach", "Attach images", size=17)
        self.attach_button.clicked.connect(self.pick_images)
        self.think_button = QToolButton()
        self.think_button.setObjectName("thinkToggle")
        self.think_button.setCheckable(True)
        self.think_button.setText("Think")
        self.think_button.setIcon(icons.icon("thinking", icons.MUTED, active=icons.ACCENT))
        self.think_button.setIconSize(QSize(15, 15))
        self.think_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.think_button.setToolTip("Let the model think before it answers")
        self.think_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.status = label("", "composerStatus")
        self.draft_count = label("", "draftCount")
        self.send_button = QToolButton()
        self.send_button.setObjectName("sendButton")
        self.send_button.setIconSize(QSize(18, 18))
        self.send_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.send_button.clicked.connect(self._on_send_button)
        tools.addWidget(self.attach_button)
        tools.addWidget(self.think_button)
        tools.addStretch(1)
        tools.addWidget(self.draft_count)
        tools.addWidget(self.status)
        tools.addWidget(self.send_button)
        column.addWidget(self.edit_banner)
        column.addWidget(self.note)
        column.addWidget(self.attachments)
        column.addWidget(self.input)
        column.addLayout(tools)
        self.streaming = False
        self._blocked_reason = ""
        self.set_streaming(False)

    # ---- state ---------------------------------------------------------------------------------
    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        self.send_button.setProperty("stop", streaming)
        self.send_button.style().unpolish(self.send_button)
        self.send_button.style().polish(self.send_button)
        self.send_button.setIcon(icons.icon("stop" if streaming else "send", icons.ON_ACCENT))
        self._update_enabled()

    def set_blocked(self, reason: str) -> None:
        """Sending is impossible (no model loaded): say why; empty reason unblocks."""
        self._blocked_reason = reason
        self._update_enabled()

    def set_vision(self, takes_images: bool) -> None:
        """Whether the chat's model takes images: without, the paperclip is off and says why, and a drop or
        paste is refused with a note (before anything is sent)."""
        self.input.images_allowed = takes_images
        self.attach_button.setEnabled(takes_images)
        self.attach_button.setToolTip("Attach images" if takes_images else NO_IMAGES)
        if takes_images:
            self.note.hide()

    def set_draft_count(self, text: str, tooltip: str = "", over: bool = False) -> None:
        """The draft's tokens ("" hides it); `over`: sending it would pass the context."""
        self.draft_count.setText(text)
        self.draft_count.setToolTip(tooltip)
        self.draft_count.setProperty("over", over)
        self.draft_count.style().unpolish(self.draft_count)
        self.draft_count.style().polish(self.draft_count)

    def _show_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.show()

    def start_editing(self, text: str, images: list[str]) -> None:
        self.input.setPlainText(text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.attachments.clear()
        for path in images:
            self.attachments.add(path)
        self.edit_banner.show()
        self.input.setFocus()

    def stop_editing(self) -> None:
        self.edit_banner.hide()

    @property
    def editing(self) -> bool:
        return not self.edit_banner.isHidden()

    def _update_enabled(self) -> None:
        self.status.setText(self._blocked_reason if not self.streaming else "")
        set_enabled(self.send_button, self.streaming or not self._blocked_reason, self._blocked_reason,
                    "Stop" if self.streaming else "Send (Enter)")
        self.send_button.setAccessibleName("Stop the reply" if self.streaming else "Send")

    # ---- input ---------------------------------------------------------------------------------
    def pick_images(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "",
                                                "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)")
        for path in paths:
            try:
                self.attachments.add(keep_image_file(path))
            except AttachmentError as e:
                self._show_note(str(e))

    def dragEnterEvent(self, event) -> None:       # accepted without vision too: the drop explains the refusal
        if takes_drop(event.mimeData()):
            event.acceptProposedAction()
            self.set_drop_highlight(True)

    def dragLeaveEvent(self, event) -> None:
        self.set_drop_highlight(False)

    def dropEvent(self, event) -> None:
        self.drop(event.mimeData())
        event.acceptProposedAction()

    def drop(self, data) -> None:
        """Files or an image dropped here or anywhere on the chat page."""
        self.set_drop_highlight(False)
        self.input.insertFromMimeData(data)

    def set_drop_highlight(self, on: bool) -> None:
        """While something droppable is dragged over the chat: the message box says where it goes."""
        self.setProperty("dropping", on)
        self.style().unpolish(self)
        self.style().polish(self)

    def _on_send_button(self) -> None:
        if self.streaming:
            self.stop_requested.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.input.toPlainText().strip()
        if self.streaming or self._blocked_reason or not (text or self.attachments.paths):
            return
        images = self.attachments.take()
        self.input.clear()
        self.note.hide()
        self.send_requested.emit(text, images)
