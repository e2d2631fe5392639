"""GET /v1/models and /v1/models/{id}, in OpenAI's shape (with what runs behind it: context length, weights, KV cache,
speculation, vision), or in Anthropic's when the client sends the `anthropic-version` header (both SDKs list models at
the same path)."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Request

from engine.server.http.errors import flavor
from engine.server.http.sse import JSON

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request):
    card = model_card(request)
    if flavor(request.scope) == "anthropic":
        return JSON({"data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]})
    return JSON({"object": "list", "data": [card]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    request.app.state.server.check_model(model_id)
    return JSON(model_card(request))


def model_card(request: Request) -> dict:
    server = request.app.state.server
    engine = server.ready()
    name = server.settings.model_id
    if flavor(request.scope) == "anthropic":
        created = datetime.fromtimestamp(server.created, timezone.utc).isoformat().replace("+00:00", "Z")
        return {"type": "model", "id": name, "display_name": name, "created_at": created}
    return {"id": name, "object": "model", "created": server.created, "owned_by": "qwendesk",
            "max_model_len": engine.max_context, "context_length": engine.max_context, **engine_card(engine)}


def engine_card(engine) -> dict:
    """What runs behind the name (the extensions vLLM and llama.cpp servers report in their own words)."""
    c, plan = engine.config, engine.plan()
    return {"status": "loaded", "weights": engine.weights, "kv_cache_dtype": plan.kv_dtype.value,
            "profile": c.profile, "max_running": c.max_running, "speculation": plan.method,
            "speculative_tokens": engine.drafts, "vision": engine.accepts_images}
