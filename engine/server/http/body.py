"""Request bodies: JSON (the Guard has already refused any other Content-Type with a 415), then a
pydantic model, with every failure a 400 in the route's envelope."""

from __future__ import annotations

import json

from fastapi import Request
from starlette.requests import ClientDisconnect
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from engine.server.http.errors import APIError, ClientGone, validation_error


INLINE_BYTES = 256 * 1024   # larger bodies are decoded on the Workers (workers.py), not on the event loop


async def parse_body(request: Request, model: type[BaseModel]):
    try:
        raw = await request.body()
    except ClientDisconnect:        # it left (or connections.py cut a stalled body): a 499 in the log, no traceback
        raise ClientGone() from None
    if len(raw) > INLINE_BYTES:
        return await request.app.state.server.workers.run(decode_body, raw, model)
    return decode_body(raw, model)


def decode_body(raw: bytes, model: type[BaseModel]):
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


# The routes read their bodies themselves (parse_body above keeps the envelopes and messages), so FastAPI
# does not see the models: a route names its model with `documented`, and `with_request_schemas` puts
# them into /openapi.json.
DOCUMENTED: dict[str, type[BaseModel]] = {}
MARK = "x-qwendesk-body"


def documented(model: type[BaseModel]) -> dict:
    """The route decorator's openapi_extra for a JSON body of this model."""
    key = f"{model.__module__}.{model.__qualname__}"
    DOCUMENTED[key] = model
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {MARK: key}}}}}


def with_request_schemas(schema: dict) -> dict:
    """An OpenAPI document with each documented body replaced by its model's JSON Schema (in components)."""
    keys = sorted(DOCUMENTED)
    refs, defs = models_json_schema([(DOCUMENTED[k], "validation") for k in keys],
                                    ref_template="#/components/schemas/{model}")
    ref_of = {k: refs[(DOCUMENTED[k], "validation")] for k in keys}
    schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
    for item in schema.get("paths", {}).values():
        for op in item.values():
            content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            if MARK in content.get("schema", {}):
                content["schema"] = ref_of[content["schema"][MARK]]
    return schema
