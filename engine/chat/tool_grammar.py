"""The grammar of Qwen3.5's tool calls (the syntax engine/chat/tools.py parses), for constrained decoding.

A call is the special token <tool_call>, then

    \\n<function=NAME>\\n
    <parameter=P>\\nVALUE\\n</parameter>\\n      (each declared parameter in schema order; required ones always)
    </function>\\n

and the special token </tool_call>; calls follow each other after a line break. A parameter the parser reads as a
string (its schema allows a string, or says no type: `value_types`) is raw text that holds none of the tags that end
a value (minLength / maxLength / enum / const enforced; format is an annotation); any other value is JSON matching
the parameter's schema (llguidance's JSON grammar), which the parser decodes. So every call the grammar allows comes
out of the parser as arguments that validate against the tool's schema; a raw-text parameter's `pattern` (an
ECMA-style regular expression, matched anywhere unless anchored with ^ and $) is enforced as llguidance's regular
expressions read it (one they cannot read: a ValueError naming it). Not expressible here, refused: contentEncoding /
contentMediaType on a raw-text parameter, and a parameters schema that is not a plain object (anyOf / oneOf / allOf /
not / if at its top, patternProperties, ...).
"""

from __future__ import annotations

import json
import re

from engine.chat.tool_values import param_schema, value_types
from engine.chat.tools import FUNC_CLOSE, FUNC_OPEN, PARAM_CLOSE, PARAM_OPEN, VALUE_ENDS

# a raw text value: any text without the tags that end a value
# (re.escape writes a line break as a backslash and the line break itself: the regex wants backslash n)
NO_END_TAG = "~/(?s:.*(" + "|".join(re.escape(t).replace("\n", "n").replace("/", "\\/") for t in VALUE_ENDS) + ").*)/"
VALUE_CLOSE = "\n" + PARAM_CLOSE + "\n"
# keywords of a parameters schema the call syntax cannot express at its top level
TOP_LEVEL_UNSUPPORTED = ("anyOf", "oneOf", "allOf", "not", "if", "then", "else", "patternProperties",
                         "dependentRequired", "dependentSchemas", "minProperties", "maxProperties",
                         "propertyNames", "unevaluatedProperties")
RAW_TEXT_KEYS = ("contentEncoding", "contentMediaType")


def calls_rules(tools: dict[str, dict], open_id: int, close_id: int, json_options: dict, only: str | None = None,
                parallel: bool = True, check=None) -> str:
    """Lark rules for `calls` (one call, or with `parallel` one or more) and `call_body` (a call after its
    <tool_call> token). tools: name -> parameters schema; only: the one tool allowed; check(schema, where): raises
    ValueError for a JSON value's schema the JSON grammar refuses. ValueError names what a schema has that cannot be
    enforced."""
    names = [only] if only else list(tools)
    functions = " | ".join(f"fn_{i}" for i in range(len(names)))
    rules = ["calls: call" + (f" ({_lit(chr(10))} call)*" if parallel else ""),
             f"call: <[{open_id}]> call_body",
             f"call_body: {_lit(chr(10))} ({functions}) {_lit(FUNC_CLOSE + chr(10))} <[{close_id}]>"]
    for i, name in enumerate(names):
        rules += _function(i, name, tools[name] or {}, json_options, check)
    return "\n".join(rules)


def _function(i: int, name: str, schema: dict, json_options: dict, check) -> list[str]:
    where = f"tool {name!r}"
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError(f"{where}: parameters must be a JSON Schema of type object")
    bad = [k for k in TOP_LEVEL_UNSUPPORTED if k in schema]
    if bad:
        raise ValueError(f"{where}: {bad[0]!r} at the top of the parameters schema cannot be enforced in tool calls")
    props = schema.get("properties") or {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    if not isinstance(props, dict):
        raise ValueError(f"{where}: properties must be an object")
    order = list(props) + [r for r in required if r not in props]
    rules, parts = [], []
    for j, pname in enumerate(order):
        if not re.fullmatch(r"[^\s<>]{1,256}", pname):
            raise ValueError(f"{where}: parameter name {pname!r} cannot be written in a tool call")
        rule = f"p_{i}_{j}"
        rules += _parameter(rule, pname, schema, json_options, check, f"{where} parameter {pname!r}")
        parts.append(rule if pname in required else rule + "?")
    head = _lit(f"{FUNC_OPEN}{name}>\n")
    return [f"fn_{i}: {head} {' '.join(parts)}".rstrip()] + rules


def _parameter(rule: str, pname: str, root: dict, json_options: dict, check, where: str) -> list[str]:
    schema = param_schema(root, pname)
    schema = {} if schema is None else schema
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{where}: its schema must be an object")
    head = _lit(f"{PARAM_OPEN}{pname}>\n")
    types = value_types(schema) if isinstance(schema, dict) else set()
    if not types or "string" in types:         # the parser takes the value as raw text
        return [f"{rule}: {head} {rule.upper()}", f"{rule.upper()}: {_raw_text(schema, where)} {_lit(VALUE_CLOSE)}"]
    sub = dict(schema) if isinstance(schema, dict) else {}
    for key in ("$defs", "definitions"):       # local $refs inside the value resolve against the tool's schema
        if key in root and key not in sub:
            sub[key] = root[key]
    if check is not None:
        check(sub, where)
    sub["x-guidance"] = json_options
    return [f"{rule}: {head} {rule}_value {_lit(VALUE_CLOSE)}", f"{rule}_value: %json {json.dumps(sub)}"]


def _raw_text(schema, where: str) -> str:
    """A terminal for a raw-text value under the string keywords the syntax can enforce."""
    if not isinstance(schema, dict):
        return f"(/(?s:.*)/ & {NO_END_TAG})"
    bad = [k for k in RAW_TEXT_KEYS if k in schema]
    if bad:
        raise ValueError(f"{where}: {bad[0]!r} cannot be enforced on a text parameter of a tool call")
    choices = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(choices, list):
        texts = [c if isinstance(c, str) else json.dumps(c) for c in choices]
        if not texts:
            raise ValueError(f"{where}: enum is empty")
        return "(" + " | ".join(_lit(t) for t in texts) + ")"
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    bad_hi = hi is not None and (not isinstance(hi, int) or isinstance(lo, int) and hi < lo)
    if not isinstance(lo, int) or lo < 0 or bad_hi:
        raise ValueError(f"{where}: minLength / maxLength must be integers with minLength <= maxLength")
    length = "*" if lo == 0 and hi is None else f"{{{lo},{'' if hi is None else hi}}}"
    pattern = schema.get("pattern")
    if pattern is None:
        return f"(/(?s:.{length})/ & {NO_END_TAG})"
    if not isinstance(pattern, str):
        raise ValueError(f"{where}: pattern must be a string")
    return f"(/(?s:.{length})/ & {_regex(pattern)} & {NO_END_TAG})"


def _regex(pattern: str) -> str:
    """A JSON Schema pattern (found anywhere in the value unless anchored) as a lark regex (matching all of it)."""
    body, head, tail = pattern, "(?s:.*)", "(?s:.*)"
    if body.startswith("^"):
        body, head = body[1:], ""
    if body.endswith("$") and not body.endswith("\\$"):
        body, tail = body[:-1], ""
    return "/" + head + "(?:" + re.sub(r"(?<!\\)/", r"\/", body) + ")" + tail + "/"


def _lit(text: str) -> str:
    """A lark string literal."""
    return json.dumps(text)
