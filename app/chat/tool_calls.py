"""Tool calls for display: as Qwen3.5 writes them in text (`<tool_call>` around `<function=NAME>` and its
`<parameter=KEY>` blocks; the format and the engine's streaming parser: engine/chat/tools.py), and as
OpenAI-compatible servers return them ({"name", "arguments": JSON text})."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FUNCTION = re.compile(r"<function=([^>\n]+)>")
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)(?:\n?</parameter>|\Z)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    complete: bool = True

    def as_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}


def parse_tool_call(body: str, closed: bool = True) -> ToolCall:
    m = FUNCTION.search(body)
    name = m.group(1).strip() if m else "…"
    arguments = {k.strip(): v for k, v in PARAMETER.findall(body)}
    return ToolCall(name, arguments, complete=closed)


def tool_call_from_dict(call: dict) -> ToolCall:
    """A stored call: {"name", "arguments"} with arguments as a dict or as JSON text (OpenAI)."""
    arguments = call.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            arguments = {"arguments": arguments}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    return ToolCall(call.get("name") or "…", arguments)


def extract_tool_calls(text: str) -> tuple[str, list[dict]]:
    """A finished reply's text without its <tool_call> blocks, and the calls as dicts."""
    calls = [parse_tool_call(m.group(1)).as_dict() for m in TOOL_CALL.finditer(text)]
    return TOOL_CALL.sub("", text).strip(), calls
