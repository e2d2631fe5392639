"""A reply's content as widgets: markdown labels, code blocks and tool calls, updated in place
while the text streams (only blocks that changed are touched)."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.chat.blocks import Block, ShownCall, split_blocks
from app.chat.code_block import CodeBlock
from app.chat.markdown import markdown_html
from app.chat.tool_call_view import ToolCallView
from app.formatting import breakable_html
from app.theme import themed_text


class MarkdownLabel(QLabel):
    def __init__(self, text: str = ""):
        super().__init__()
        self.setObjectName("markdown")
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)
        self.setOpenExternalLinks(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self.markdown = ""
        self.set_markdown(text)

    def set_markdown(self, text: str) -> None:
        if text != self.markdown:
            self.markdown = text
            self.setText(breakable_html(themed_text(markdown_html(text))))


class ContentView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(10)
        self._blocks: list[tuple[Block, QWidget]] = []

    def set_text(self, text: str, tool_calls: Sequence[ShownCall] = (), writing: bool = False) -> None:
        """`tool_calls`: calls the backend gave apart from the text; `writing`: the text is still streaming."""
        blocks = split_blocks(text, writing) + [Block("tool_call", call=c) for c in tool_calls]
        for i, block in enumerate(blocks):
            if i < len(self._blocks) and self._same_kind(self._blocks[i][0], block):
                self._update(self._blocks[i][1], block)
                self._blocks[i] = (block, self._blocks[i][1])
            else:
                self._truncate(i)
                widget = self._create(block)
                self.column.addWidget(widget)
                self._blocks.append((block, widget))
        self._truncate(len(blocks))

    def widgets(self) -> list[QWidget]:
        return [w for _, w in self._blocks]

    @staticmethod
    def _same_kind(old: Block, new: Block) -> bool:
        return old.kind == new.kind and old.language == new.language

    @staticmethod
    def _create(block: Block) -> QWidget:
        if block.call is not None:
            return ToolCallView(block.call)
        if block.kind == "code":
            return CodeBlock(block.text, block.language)
        return MarkdownLabel(block.text)

    @staticmethod
    def _update(widget: QWidget, block: Block) -> None:
        """A widget _create made for a block of the same kind, shown again with the block's text."""
        if isinstance(widget, ToolCallView) and block.call is not None:
            widget.set_call(block.call)
        elif isinstance(widget, CodeBlock):
            widget.set_code(block.text, block.language)
        elif isinstance(widget, MarkdownLabel):
            widget.set_markdown(block.text)

    def _truncate(self, keep: int) -> None:
        while len(self._blocks) > keep:
            _, widget = self._blocks.pop()
            widget.deleteLater()
            self.column.removeWidget(widget)
