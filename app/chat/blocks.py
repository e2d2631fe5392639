"""Split a reply's text into what the transcript draws: markdown prose, fenced code blocks and
tool calls. Works on partial text while a reply streams (an open fence is a code block still
being written)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.chat.tool_calls import ToolCall, parse_tool_call

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^\n]*$")
TOOL_CALL_SO_FAR = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)   # closed, or still streaming


@dataclass
class Block:
    kind: str                       # markdown | code | tool_call
    text: str = ""
    language: str = ""              # code
    closed: bool = True             # code: the closing fence arrived
    call: ToolCall | None = None    # tool_call


def split_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    prose: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        _flush_prose(blocks, prose)
        fence, language = m.group(1), m.group(2)
        body, i, closed = [], i + 1, False
        while i < len(lines):
            if lines[i].strip().startswith(fence[0] * len(fence)) and not lines[i].strip().strip(fence[0]):
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        blocks.append(Block("code", "\n".join(body), language.lower(), closed))
    _flush_prose(blocks, prose)
    return blocks


def _flush_prose(blocks: list[Block], prose: list[str]) -> None:
    """Prose becomes markdown blocks, with tool calls cut out as blocks of their own."""
    text = "\n".join(prose)
    prose.clear()
    pos = 0
    for m in TOOL_CALL_SO_FAR.finditer(text):
        _add_markdown(blocks, text[pos:m.start()])
        blocks.append(Block("tool_call", m.group(0), call=parse_tool_call(m.group(1), closed=bool(m.group(2)))))
        pos = m.end()
    _add_markdown(blocks, text[pos:])


def _add_markdown(blocks: list[Block], text: str) -> None:
    if text.strip():
        blocks.append(Block("markdown", text.strip("\n")))
