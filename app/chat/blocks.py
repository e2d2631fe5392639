"""Split a reply's text into what the transcript draws: markdown prose, fenced code blocks and
tool calls. Works on partial text while a reply streams (an open fence is a code block still
being written, and so is a call whose end has not come).

The calls are found by the engine's parser (engine/chat/tools.py), in both the forms Qwen models
write: `<tool_call>` around `<function=NAME>` and its `<parameter=KEY>` blocks, and `<tool_call>`
around a JSON object {"name", "arguments"}. Calls come first: a call's parameters may hold fences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.api import CallArgs, CallStart, Text, ToolCallParser, call_arguments

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^\n]*$")


@dataclass
class ShownCall:
    """A tool call as the transcript shows it."""
    name: str
    arguments: dict = field(default_factory=dict)
    complete: bool = True           # False while the model is still writing it

    @classmethod
    def from_dict(cls, call: dict) -> ShownCall:
        """A stored call: {"name", "arguments"}, the arguments a dict or a JSON object's text (OpenAI's form)."""
        try:
            arguments = call_arguments(call.get("arguments"))
        except ValueError:      # what a server sent that is no JSON object: kept as it came
            arguments = {"arguments": call["arguments"]}
        return cls(call.get("name") or "…", arguments)

    def as_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class Block:
    kind: str                       # markdown | code | tool_call
    text: str = ""
    language: str = ""              # code
    closed: bool = True             # code: the closing fence arrived
    call: ShownCall | None = None   # tool_call


def split_blocks(text: str, writing: bool = False) -> list[Block]:
    """`writing`: the reply is still streaming (a call it ends inside is one being written)."""
    blocks: list[Block] = []
    for part in reply_parts(text, writing):
        if isinstance(part, ShownCall):
            blocks.append(Block("tool_call", call=part))
        else:
            blocks += _prose_blocks(part)
    return blocks


def extract_tool_calls(text: str) -> tuple[str, list[dict]]:
    """A finished reply's text without its tool calls, and the calls as dicts."""
    parts = reply_parts(text)
    prose = "\n\n".join(p.strip() for p in parts if isinstance(p, str) and p.strip())
    return prose, [p.as_dict() for p in parts if isinstance(p, ShownCall)]


def reply_parts(text: str, writing: bool = False) -> list[str | ShownCall]:
    """The reply's prose and its tool calls, in order."""
    parser = ToolCallParser()
    events = parser.feed(text)
    open_call = writing and parser.in_call
    tail = parser.finish()
    unnamed = open_call and any(isinstance(e, Text) for e in tail)   # its opening came back as text: no name yet
    parts: list = []
    arguments: list[str] = []
    for event in events + ([e for e in tail if not isinstance(e, Text)] if unnamed else tail):
        if isinstance(event, Text):
            if parts and isinstance(parts[-1], str):
                parts[-1] += event.text
            else:
                parts.append(event.text)
        elif isinstance(event, CallStart):
            parts.append(ShownCall(event.name))
            arguments.append("")
        elif isinstance(event, CallArgs):
            arguments[event.index] += event.text
    calls = [p for p in parts if isinstance(p, ShownCall)]
    for call, text_so_far in zip(calls, arguments):
        call.arguments = call_arguments(text_so_far)
    if unnamed:
        parts.append(ShownCall("…", complete=False))
    elif open_call:
        calls[-1].complete = False
    return parts


def _prose_blocks(text: str) -> list[Block]:
    """Markdown and fenced code blocks."""
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
        _add_markdown(blocks, prose)
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
    _add_markdown(blocks, prose)
    return blocks


def _add_markdown(blocks: list[Block], prose: list[str]) -> None:
    text = "\n".join(prose)
    prose.clear()
    if text.strip():
        blocks.append(Block("markdown", text.strip("\n")))
