"""A tool call's argument values: typed by the tool's JSON schema (a local $ref followed), parsed from JSON or from
what a model used to Python writes, and JSON cut short closed (engine/chat/tools.py's parser uses them)."""

from __future__ import annotations

import ast
import json


def closed_json(text: str, tries: int = 64):
    """A JSON value cut short, completed: an open string ends where it was cut, open arrays and objects close,
    and what is left dangling (a key without its value, a partial number or literal) is dropped. Tries the
    places it could be cut back to, latest first; None when none of the last `tries` parses."""
    cuts: list[tuple[int, str]] = []
    closers: list[str] = []
    in_string, escaped = False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                cuts.append((i + 1, "".join(reversed(closers))))
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
            cuts.append((i + 1, "".join(reversed(closers))))
        elif ch in "}]" and closers:
            closers.pop()
            cuts.append((i + 1, "".join(reversed(closers))))
        elif ch == ",":
            cuts.append((i, "".join(reversed(closers))))
    end = "".join(reversed(closers))
    whole = text[:-1] if escaped else text
    candidates = [whole + ('"' if in_string else "") + end] + [text[:i] + c for i, c in reversed(cuts)]
    for candidate in candidates[:tries]:
        try:
            return strict_json(candidate)
        except (ValueError, RecursionError):
            pass
    return None


def strict_json(text: str):
    """json.loads without NaN / Infinity, which no JSON client accepts back."""
    value = json.loads(text, parse_constant=_no_constant)
    json.dumps(value, allow_nan=False)   # 1e999 parses to inf
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def call_arguments(arguments) -> dict:
    """A call's arguments as a dict, from a dict or from a JSON object's text (OpenAI's form; empty text or
    None: no arguments). Raises ValueError saying what is wrong with the text."""
    if arguments is None or isinstance(arguments, dict):
        return arguments or {}
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):
        raise ValueError("is not valid JSON") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


def param_schema(tool_schema, name: str):
    """A parameter's schema in a tool's parameters schema, a local $ref (#/$defs/X, #/definitions/X) followed;
    None when the tool does not declare it."""
    props = tool_schema.get("properties") if isinstance(tool_schema, dict) else None
    schema = props.get(name) if isinstance(props, dict) else None
    return resolve_ref(tool_schema, schema)


def resolve_ref(root, schema, depth: int = 8):
    """`schema`, or what its local $ref points to in `root` (a few hops at most)."""
    while depth and isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref, depth = schema["$ref"], depth - 1
        target = root
        for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else [None]:
            target = target.get(part) if isinstance(target, dict) and part is not None else None
        if not isinstance(target, dict):
            return schema
        schema = target
    return schema


def value_types(schema) -> set[str]:
    """The JSON types a parameter's schema allows (empty: unknown; the parser then takes its value as a string)."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    found = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            found |= value_types(sub)
    if not found and isinstance(schema.get("enum"), list):
        found = {_json_type(v) for v in schema["enum"]}
    if not found and "properties" in schema:
        found = {"object"}
    if not found and "items" in schema:
        found = {"array"}
    return found


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    names = {float: "number", str: "string", list: "array", dict: "object", type(None): "null"}
    return names.get(type(value), "string")


def coerce(value: str, types: set[str]):
    """A parameter's text as the JSON value its schema asks for; the text itself when it is none of them."""
    parsed = _parse_value(value.strip())
    if parsed is _NOT_A_VALUE:
        return value
    kind = _json_type(parsed)
    if kind in types or (kind == "integer" and "number" in types):
        return parsed
    if kind == "number" and "integer" in types and parsed.is_integer():
        return int(parsed)
    return value


_NOT_A_VALUE = object()
_PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}


def _parse_value(text: str):
    """JSON, or what a model used to Python writes (True, None, {'a': 1}); _NOT_A_VALUE otherwise."""
    try:
        return strict_json(text)
    except ValueError:
        pass
    if text in _PYTHON_CONSTANTS:
        return _PYTHON_CONSTANTS[text]
    if text[:1] in ("[", "{"):
        try:
            value = ast.literal_eval(text)
            json.dumps(value, allow_nan=False)
            return value
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return _NOT_A_VALUE
