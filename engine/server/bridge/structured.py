"""Structured output requests -> the engine's Constraint (engine.api): OpenAI's `response_format` (chat and
completions), the Responses API's `text.format` (the same with the schema's fields flattened into it), Anthropic's
`output_config.format` / `output_format`; and the constraint of a request's tool_choice. The engine checks the
schemas when the request is submitted (an invalid one, or a keyword it cannot enforce: a 400 naming it)."""

from __future__ import annotations

from engine.api import Constraint
from engine.server.http.errors import APIError

ANY_OBJECT = {"type": "object"}


def response_constraint(fmt: dict | None, param: str = "response_format") -> Constraint | None:
    """{"type": "text"} or None: no constraint; {"type": "json_object"}: any JSON object; {"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}} (or with name / schema / strict beside "type", as the Responses API
    and Anthropic send it): JSON matching the schema. strict true or false, the schema is enforced as given."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return Constraint(json_schema=ANY_OBJECT)
    if kind != "json_schema":
        raise APIError(400, f"{param}.type must be text, json_object or json_schema, not {kind!r}", param=param)
    spec = fmt.get("json_schema", fmt)
    if not isinstance(spec, dict):
        raise APIError(400, f"{param}.json_schema must be an object holding the schema", param=param)
    schema = spec.get("schema", ANY_OBJECT)
    if not isinstance(schema, dict):
        raise APIError(400, f"{param}: the schema must be a JSON object", param=param)
    return Constraint(json_schema=schema)


def request_constraint(json_format: Constraint | None, tools: list[dict] | None, mode: str, name: str | None,
                       parallel: bool) -> Constraint | None:
    """The constraint of a chat request: its structured output, and its tool calls (tool_choice auto: a call is
    constrained once the model opens it; required: the reply is calls; function: one call to that tool; none: no
    calls, the tool-call token is banned elsewhere)."""
    if not tools or mode == "none":
        return json_format
    return Constraint(json_schema=json_format.json_schema if json_format else None, tools=tools,
                      tool_mode="auto" if mode == "auto" else "required",
                      tool_name=name if mode == "function" else None, parallel=parallel)
