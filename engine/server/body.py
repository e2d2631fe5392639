"""Request bodies: JSON (the Guard has already refused any other Content-Type with a 415), then a
pydantic model, with every failure a 400 in the route's envelope."""

from __future__ import annotations

import json

from fastapi import Request
from pydantic import BaseModel, ValidationError

from engine.server.errors import APIError, validation_error


async def parse_body(request: Request, model: type[BaseModel]):
    raw = await request.body()
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
