"""The Responses API: POST /v1/responses (streamed or not), GET and DELETE /v1/responses/{id}.

A request becomes a chat request (convert.py) and runs as chat completions do; its events
become the Response's output items (output.py). Unless `store` is false, the response and its
conversation are kept (store.py) for GET and for a next turn's `previous_response_id`.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from engine.server.http.body import documented, parse_body
from engine.server.http.errors import APIError
from engine.server.bridge.generation import Finish, Keepalive, collect_all
from engine.server.bridge.prompting import chat_prompts
from engine.server.responses.convert import Prepared, prepare
from engine.server.responses.output import ResponseBuilder, new_id
from engine.server.responses.schema import ResponsesRequest
from engine.server.http.sse import JSON, comment, event, sse_response

router = APIRouter()


@router.post("/v1/responses", openapi_extra=documented(ResponsesRequest))
async def create_response(request: Request):
    server = request.app.state.server
    body = await parse_body(request, ResponsesRequest)
    engine = server.ready()
    server.check_model(body.model)
    history = []
    if body.previous_response_id is not None:
        stored = server.responses.get(body.previous_response_id)
        if stored is None:
            raise APIError(400, f"Previous response with id '{body.previous_response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        history = stored.items
    prepared = prepare(body, history, engine.model_config.vocab_size, server.image_options())
    try:
        prepared.chat.special_text = server.settings.special_text
        [prompt] = await server.workers.run(chat_prompts, engine, prepared.chat, server.defaults)
        [gen] = await server.start([[prompt]])
    except APIError as e:
        raise prepared.renames(e) from None
    response = response_object(body, prepared, prompt.params)
    include = body.include or []
    builder = ResponseBuilder(response, summary=bool(body.reasoning and (body.reasoning.summary or
                                                                         body.reasoning.generate_summary)),
                              sealed="reasoning.encrypted_content" in include,
                              token_bytes=server.token_bytes if "message.output_text.logprobs" in include else None)

    def keep():
        if body.store is not False and response["status"] != "failed":
            server.responses.put(response, prepared.items + response["output"])

    if body.stream:
        return sse_response(response_stream(gen.events(), builder, keep), [gen])

    async def build(g) -> Finish:
        async for ev in g.events():
            if isinstance(ev, Finish):
                builder.finish(ev)
                return ev
            builder.feed(ev)
        raise RuntimeError("the generation ended without a finish event")

    [finish] = await collect_all(request, [gen], consume=build)
    if finish.api_error():
        raise finish.api_error()
    keep()
    return JSON(response)


async def response_stream(events, builder: ResponseBuilder, keep):
    for e in builder.start():
        yield event(e, e["type"])
    async for ev in events:
        if isinstance(ev, Keepalive):
            yield comment()
            continue
        if isinstance(ev, Finish):
            out = builder.finish(ev)
            keep()
        else:
            out = builder.feed(ev)
        for e in out:
            yield event(e, e["type"])


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str):
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError(400, "stream is not supported here: responses are never in the background", param="stream")
    return JSON(stored(request, response_id).response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str):
    stored(request, response_id)
    request.app.state.server.responses.delete(response_id)
    return JSON({"id": response_id, "object": "response", "deleted": True})


def stored(request: Request, response_id: str):
    entry = request.app.state.server.responses.get(response_id)
    if entry is None:
        raise APIError(404, f"Response with id '{response_id}' not found.", "not_found", param="response_id")
    return entry


def response_object(body: ResponsesRequest, prepared: Prepared, params) -> dict:
    """The Response, in progress: what the request asked for, with the sampling the engine runs."""
    reasoning = body.reasoning
    return {
        "id": new_id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
        "background": False, "completed_at": None, "error": None, "incomplete_details": None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls, "metadata": body.metadata or {}, "model": body.model, "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": reasoning.effort if reasoning else None,
                      "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None},
        "service_tier": "default", "store": body.store is not False,
        "temperature": params.temperature, "top_p": params.top_p,
        "text": {"format": (body.text.format if body.text else None) or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.tool_choice or "auto", "tools": prepared.tools, "top_logprobs": body.top_logprobs or 0,
        "truncation": "disabled", "usage": None, "user": body.user, "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
    }
