"""Qwen tool calls in generated text -> structured calls, incrementally.

Qwen3.5 writes a call in the form its chat template teaches:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

and earlier Qwen models as JSON: `<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>`.

`ToolCallParser.feed(delta)` takes the reply's text as it streams and returns events (engine/core/params.py):
`Text` to show, `CallStart` (a call's name, as soon as it is known), then `CallArgs` pieces whose
concatenation is the call's arguments as one JSON object. Parameter values are typed by the tool's JSON
schema: a string parameter streams as it arrives; a number, boolean, object or array is parsed when its
value is complete. A JSON-form call comes out whole when its </tool_call> arrives. Output that does not
form a call (no function, an unknown tool, broken JSON) is passed on as text, never dropped and never an
error. A call cut short (the reply ended inside it) is closed into valid JSON.

The engine runs the parser on a reply's content when the request has tools; the app runs it on a reply's
text to draw the calls in it.
"""

from __future__ import annotations

import json
import re

from engine.chat.tool_values import closed_json, coerce, param_schema, strict_json, value_types
from engine.core.params import CallArgs, CallStart, Text

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FUNC_OPEN, FUNC_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
# where a parameter's value ends: its closing tag, or (when the model forgot it) what comes next
VALUE_ENDS = (PARAM_CLOSE, "\n" + PARAM_OPEN, FUNC_CLOSE, TOOL_CLOSE)
NAME = re.compile(r"[^\s<>]{1,256}")


def tool_schemas(tools) -> dict[str, dict]:
    """OpenAI-style tool list ({"type": "function", "function": {name, parameters}}) -> name: parameters."""
    schemas = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        schemas[fn["name"]] = fn.get("parameters") or {}
    return schemas


class ToolCallParser:
    def __init__(self, schemas: dict[str, dict] | None = None):
        """`schemas`: tool name -> JSON schema of its parameters; None accepts any name, string values."""
        self.schemas = schemas
        self.state = "text"
        self.buf = ""           # text received and not yet consumed
        self.held_space = ""    # trailing whitespace of the text, shown only if text follows
        self.calls = 0
        self.name = ""          # the current call's function
        self.after_call = False
        self.raw = ""           # what a call began with, given back as text if it turns out malformed
        self.params = 0         # parameters written in the current call
        self.param_types: set[str] = set()
        self.value_fresh = False
        self.out: list = []

    @property
    def in_call(self) -> bool:
        """A call has opened (<tool_call>) and not closed yet."""
        return self.state not in ("text", "passthrough")

    def feed(self, delta: str) -> list:
        self.buf += delta
        self._run(final=False)
        return self._take()

    def finish(self) -> list:
        """End of the reply: close what is open, give back what never became a call."""
        self._run(final=True)
        if self.state == "open":
            self._text(self.raw + self.buf)
        elif self.state == "json":
            self._json_call(self.buf, closed=False)
        elif self.state == "value":
            self._end_value(self.buf)
            self._close_args()
        elif self.state == "function":
            self._close_args()
        elif self.state in ("text", "passthrough"):
            self._text(self.buf)
        self.buf = ""
        if self.calls == 0 and self.held_space:
            self.out.append(Text(self.held_space))
        self.held_space = ""
        self.state = "text"
        return self._take()

    # ---- the state machine -------------------------------------------------------------------
    def _run(self, final: bool) -> None:
        steps = {"text": self._in_text, "open": self._in_open, "function": self._in_function,
                 "value": self._in_value, "after_function": self._after_function, "json": self._in_json,
                 "passthrough": self._in_passthrough}
        while self.buf and steps[self.state](final):
            pass

    def _in_text(self, final: bool) -> bool:
        i = self.buf.find(TOOL_OPEN)
        if i < 0:
            keep = 0 if final else _partial_suffix(self.buf, (TOOL_OPEN,))
            self._text(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        self._text(self.buf[:i])
        self.raw, self.buf, self.state = TOOL_OPEN, self.buf[i + len(TOOL_OPEN):], "open"
        return True

    def _in_open(self, final: bool) -> bool:
        """After <tool_call>: a <function=NAME> or a JSON object must follow."""
        body = self.buf.lstrip()
        if body.startswith("{"):
            self.state = "json"
            return True
        if body.startswith(FUNC_OPEN):
            end = body.find(">")
            if end < 0 and not final and len(body) < 300:
                return False                                  # the name is still arriving
            name = body[len(FUNC_OPEN):end].strip() if end > 0 else ""
            if NAME.fullmatch(name):
                head = self.buf[:len(self.buf) - len(body) + end + 1]
                self.buf = body[end + 1:]
                if self.schemas is not None and name not in self.schemas:
                    self._text(self.raw + head)              # not one of the tools: plain text
                    self.state = "passthrough"
                else:
                    self._start_call(name)
                return True
        elif not final and (body == "" or FUNC_OPEN.startswith(body)):
            return False
        self._text(self.raw)                                 # malformed: what followed is text again
        self.state = "text"
        return True

    def _in_function(self, final: bool) -> bool:
        """Inside <function=...>: parameters until </function>."""
        body = self.buf.lstrip()
        if body.startswith(PARAM_OPEN):
            end = body.find(">")
            if end < 0:
                if final or "\n" in body or len(body) > 300:
                    self.buf = body[1:]                      # a broken tag: skip it as noise
                    return True
                return False
            self._start_value(body[len(PARAM_OPEN):end].strip())
            self.buf = body[end + 1:]
            return True
        for tag, state in ((FUNC_CLOSE, "after_function"), (TOOL_CLOSE, "text")):
            if body.startswith(tag):
                self._close_args()
                self.buf, self.state = body[len(tag):], state
                self.after_call = True
                return True
        if not final and any(tag.startswith(body) for tag in (PARAM_OPEN, FUNC_CLOSE, TOOL_CLOSE)):
            self.buf = body
            return False
        nxt = body.find("<", 1)                              # stray text between parameters: noise
        self.buf = body[nxt:] if nxt > 0 else ""
        return bool(self.buf)

    def _in_value(self, final: bool) -> bool:
        if self.value_fresh:                                 # the line break after <parameter=...>
            if self.buf == "\n" and not final:
                return False
            self.buf = self.buf.removeprefix("\n")
            self.value_fresh = False
        ends = [i for i in (self.buf.find(tag) for tag in VALUE_ENDS) if i >= 0]
        if ends:
            cut = min(ends)
            self._end_value(self.buf[:cut])
            rest = self.buf[cut:]
            self.buf = rest[len(PARAM_CLOSE):] if rest.startswith(PARAM_CLOSE) else rest.lstrip("\n")
            self.state = "function"
            return True
        if self._streams_as_string():
            keep = _partial_suffix(self.buf, VALUE_ENDS)
            safe = self.buf[:len(self.buf) - keep]
            safe = safe.removesuffix("\n")            # may be the line break before </parameter>
            if safe:
                self._args(json.dumps(safe, ensure_ascii=False)[1:-1])
                self.buf = self.buf[len(safe):]
        return False

    def _after_function(self, final: bool) -> bool:
        body = self.buf.lstrip()
        if body.startswith(TOOL_CLOSE):
            self.buf, self.state = body[len(TOOL_CLOSE):], "text"
            return True
        if body.startswith(FUNC_OPEN):                       # a next call without </tool_call> between
            self.raw, self.buf, self.state = "", body, "open"
            return True
        if not final and (body == "" or TOOL_CLOSE.startswith(body) or FUNC_OPEN.startswith(body)):
            self.buf = body
            return False
        self.buf, self.state = body, "text"
        return True

    def _in_json(self, final: bool) -> bool:
        end = self.buf.find(TOOL_CLOSE)
        if end < 0:
            return False
        self._json_call(self.buf[:end], closed=True)
        self.buf, self.state = self.buf[end + len(TOOL_CLOSE):], "text"
        return True

    def _in_passthrough(self, final: bool) -> bool:
        """A call to an unknown tool: shown as text up to its </tool_call>."""
        end = self.buf.find(TOOL_CLOSE)
        if end >= 0:
            self._text(self.buf[:end + len(TOOL_CLOSE)])
            self.buf, self.state = self.buf[end + len(TOOL_CLOSE):], "text"
            return True
        keep = 0 if final else _partial_suffix(self.buf, (TOOL_CLOSE,))
        self._text(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False

    # ---- output ------------------------------------------------------------------------------
    def _text(self, text: str) -> None:
        if self.after_call:
            text = text.lstrip()
            self.after_call = not text
        text = self.held_space + text
        shown = text.rstrip()
        self.held_space = text[len(shown):]
        if shown:
            self.out.append(Text(shown))

    def _start_call(self, name: str) -> None:
        self.held_space = ""                                 # no blank lines before a call
        self.out.append(CallStart(self.calls, name))
        self.calls += 1
        self.name = name
        self.params = 0
        self.state = "function"

    def _start_value(self, name: str) -> None:
        self.param_types = value_types(param_schema((self.schemas or {}).get(self.name, {}), name))
        opening = ("{" if self.params == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        self._args(opening + ('"' if self._streams_as_string() else ""))
        self.params += 1
        self.value_fresh = True
        self.state = "value"

    def _end_value(self, value: str) -> None:
        value = value.removesuffix("\n")
        if self._streams_as_string():
            self._args(json.dumps(value, ensure_ascii=False)[1:] if value else '"')
        else:
            self._args(json.dumps(coerce(value, self.param_types), ensure_ascii=False))

    def _close_args(self) -> None:
        self._args("}" if self.params else "{}")

    def _args(self, text: str) -> None:
        last = self.out[-1] if self.out else None
        if isinstance(last, CallArgs) and last.index == self.calls - 1:
            last.text += text
        else:
            self.out.append(CallArgs(self.calls - 1, text))

    def _json_call(self, body: str, closed: bool) -> None:
        call = _parse_json_call(body, closed)
        if call is None or (self.schemas is not None and call[0] not in self.schemas):
            self._text(self.raw + body + (TOOL_CLOSE if closed else ""))
            return
        self._start_call(call[0])
        self._args(json.dumps(call[1], ensure_ascii=False))
        self.after_call = True

    def _streams_as_string(self) -> bool:
        return not self.param_types or "string" in self.param_types

    def _take(self) -> list:
        out, self.out = self.out, []
        return out


def _partial_suffix(text: str, tags) -> int:
    """Length of the longest end of `text` that could be the start of one of `tags`."""
    for n in range(min(len(text), max(len(t) for t in tags) - 1), 0, -1):
        if any(t.startswith(text[-n:]) for t in tags):
            return n
    return 0


def _parse_json_call(body: str, closed: bool = True) -> tuple[str, dict] | None:
    """A JSON-form call's (name, arguments); one whose </tool_call> never came is closed first if it was cut short."""
    try:
        data = strict_json(body)
    except (ValueError, RecursionError):
        data = None if closed else closed_json(body)
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not NAME.fullmatch(data["name"]):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = strict_json(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None
    return (data["name"], args) if isinstance(args, dict) else None
