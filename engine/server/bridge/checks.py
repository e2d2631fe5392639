"""Request checks shared by the routes: fields the server cannot honour, the number of samples, tool schemas.

No silent ignores: a field whose meaning would change the reply (audio output, web search, predicted
outputs, MCP servers, ...) is refused with a 400 naming it. Fields that change nothing the client can see
(user, metadata, store, service_tier, prompt_cache_key, cache_control, ...) and fields nobody has defined are
accepted and ignored: clients such as LangChain and litellm send extras of their own, and refusing those would
break them for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import jsonschema
from jsonschema.validators import validator_for

from engine.server.http.errors import APIError

MAX_SAMPLES = 16        # n: samples of one prompt in one request


@dataclass(frozen=True)
class Unsupported:
    field: str
    refused: Callable[[Any], bool]      # the given value -> whether the server cannot honour it
    why: str


def given(value) -> bool:
    """Set to something that asks for the feature (null, false, "" and an empty list or object ask for nothing)."""
    return value not in (None, False, "", [], {})


OPENAI_CHAT = (
    Unsupported("audio", given, "audio output is not supported (text only)"),
    Unsupported("modalities", lambda v: isinstance(v, list) and any(m != "text" for m in v),
                "only the text modality is supported"),
    Unsupported("prediction", given, "predicted outputs are not supported"),
    Unsupported("web_search_options", given, "web search is not available on this server"),
    Unsupported("verbosity", lambda v: v not in (None, "medium"),
                "verbosity is not supported (ask for a shorter or longer answer in the prompt)"),
)
OPENAI_COMPLETIONS = (
    Unsupported("suffix", given, "suffix (insertion) is not supported: this server only continues the prompt"),
    Unsupported("best_of", lambda v: v not in (None, 1), "best_of is not supported; use n for several samples"),
)
ANTHROPIC_MESSAGES = (
    Unsupported("mcp_servers", given, "MCP servers are not available here; define client tools with an input_schema"),
    Unsupported("container", given, "containers (code execution) are not available on this server"),
    Unsupported("context_management", given, "context management (server-side edits) is not available; "
                                              "trim the conversation on the client"),
)


def refuse_unsupported(body: dict | None, table: tuple[Unsupported, ...]) -> None:
    """`body`: the request's fields (a pydantic model's model_dump() with its extras)."""
    fields = body or {}
    for rule in table:
        if rule.field in fields and rule.refused(fields[rule.field]):
            raise APIError(400, f"{rule.field}: {rule.why}", param=rule.field, code="unsupported_parameter")


def check_tool_schema(schema: dict | None, where: str) -> None:
    """A tool's parameters must be a valid JSON Schema (by the meta-schema of its $schema, default 2020-12)."""
    if schema is None:
        return
    if not isinstance(schema.get("$schema", ""), str):
        raise APIError(400, f"{where}.$schema must be a string", param=where, code="invalid_tool_schema")
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        at = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        raise APIError(400, f"{where} is not a valid JSON Schema: at {at or 'the top'}: {e.message}",
                       param=where, code="invalid_tool_schema") from None
    except RecursionError:
        raise APIError(400, f"{where} is nested too deeply", param=where, code="invalid_tool_schema") from None
