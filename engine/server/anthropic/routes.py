"""Anthropic routes: POST /v1/messages (streamed or not) and POST /v1/messages/count_tokens."""

from __future__ import annotations

import hashlib
import json
import secrets

from fastapi import APIRouter, Request

from engine.api import CallArgs, CallStart, Reasoning, Text, Usage
from engine.server.openai.routes import speculation_json
from engine.server.anthropic.convert import chat_request
from engine.server.anthropic.schema import CountTokensRequest, MessagesRequest
from engine.server.http.body import documented, parse_body
from engine.server.bridge.checks import ANTHROPIC_MESSAGES, refuse_unsupported
from engine.server.http.errors import error_payload
from engine.server.bridge.generation import Finish, Keepalive, Reply, collect, collect_all
from engine.server.bridge.prompting import chat_prompts, prompt_ids
from engine.server.http.sse import JSON, event, sse_response

router = APIRouter()

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


@router.post("/v1/messages", openapi_extra=documented(MessagesRequest))
async def messages(request: Request):
    server = request.app.state.server
    body = await parse_body(request, MessagesRequest)
    engine = server.ready()
    server.check_model(body.model)
    refuse_unsupported(body.model_extra, ANTHROPIC_MESSAGES)
    req = chat_request(body, server.image_options())
    req.special_text = server.settings.special_text
    [prompt] = await server.workers.run(chat_prompts, engine, req, server.defaults)
    [gen] = await server.start([[prompt]])
    omit_thinking = bool(body.thinking and body.thinking.display == "omitted")
    message = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant", "model": body.model}
    events = gen.events() if req.thinking.enabled else without_thinking(gen.events())
    if body.stream:
        return sse_response(message_stream(events, message, len(prompt.ids), omit_thinking), [gen])
    reply = (await collect_all(request, [gen], lambda _: collect(events)))[0]
    finish = reply.finish
    if finish.api_error():
        raise finish.api_error()
    return JSON({**message, "content": content_blocks(reply, omit_thinking), **stop_fields(finish),
                 "usage": usage_json(finish.usage)})


@router.post("/v1/messages/count_tokens", openapi_extra=documented(CountTokensRequest))
async def count_tokens(request: Request):
    server = request.app.state.server
    body = await parse_body(request, CountTokensRequest)
    engine = server.ready()
    server.check_model(body.model)
    req = chat_request(body, server.image_options())
    req.special_text = server.settings.special_text
    ids, _ = await server.workers.run(prompt_ids, engine, req)
    return JSON({"input_tokens": len(ids)})


async def without_thinking(events):
    """A request without `thinking` gets no thinking block, even when the model opens one mid-reply
    (the template already closed the one it would start with): that reasoning is dropped, as a reply
    with thinking disabled has none. Its tokens still count as output tokens."""
    async for ev in events:
        if not isinstance(ev, Reasoning):
            yield ev


def content_blocks(reply: Reply, omit_thinking: bool) -> list[dict]:
    blocks = []
    for block in reply.blocks:
        if block[0] == "thinking":
            blocks.append({"type": "thinking", "thinking": "" if omit_thinking else block[1],
                           "signature": signature(block[1])})
        elif block[0] == "text":
            blocks.append({"type": "text", "text": block[1]})
        else:
            blocks.append({"type": "tool_use", "id": "toolu_" + secrets.token_hex(12), "name": block[1],
                           "input": json.loads(block[2])})
    return blocks


async def message_stream(events, message: dict, prompt_tokens: int, omit_thinking: bool):
    """message_start, ping, content blocks (start / deltas / stop), message_delta, message_stop."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_read_input_tokens": 0,
                       "cache_creation_input_tokens": 0}}
    yield event({"type": "message_start", "message": start}, "message_start")
    yield event({"type": "ping"}, "ping")
    index, open_kind = -1, None
    thinking: list[str] = []

    def open_block(kind: str, block: dict):
        nonlocal index, open_kind
        index, open_kind = index + 1, kind
        return event({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")

    def delta(body: dict):
        return event({"type": "content_block_delta", "index": index, "delta": body}, "content_block_delta")

    def close_block():
        nonlocal open_kind
        out = []
        if open_kind == "thinking":
            out.append(delta({"type": "signature_delta", "signature": signature("".join(thinking))}))
            thinking.clear()
        if open_kind is not None:
            out.append(event({"type": "content_block_stop", "index": index}, "content_block_stop"))
        open_kind = None
        return out

    async for ev in events:
        if isinstance(ev, Reasoning) and open_kind != "tool":   # (thinking inside a call's arguments: dropped)
            if open_kind != "thinking":
                for chunk in close_block():
                    yield chunk
                yield open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            thinking.append(ev.text)
            if not omit_thinking:
                yield delta({"type": "thinking_delta", "thinking": ev.text})
        elif isinstance(ev, Text):
            if open_kind != "text":
                for chunk in close_block():
                    yield chunk
                yield open_block("text", {"type": "text", "text": ""})
            yield delta({"type": "text_delta", "text": ev.text})
        elif isinstance(ev, CallStart):
            for chunk in close_block():
                yield chunk
            yield open_block("tool", {"type": "tool_use", "id": "toolu_" + secrets.token_hex(12), "name": ev.name,
                                      "input": {}})
        elif isinstance(ev, CallArgs) and open_kind == "tool":
            yield delta({"type": "input_json_delta", "partial_json": ev.text})
        elif isinstance(ev, Keepalive):
            yield event({"type": "ping"}, "ping")
        elif isinstance(ev, Finish):
            for chunk in close_block():
                yield chunk
            if (error := ev.api_error()) is not None:
                yield event(error_payload(error, "anthropic")[1], "error")
                return
            yield event({"type": "message_delta", "delta": stop_fields(ev), "usage": usage_json(ev.usage)},
                        "message_delta")
            yield event({"type": "message_stop"}, "message_stop")


def stop_fields(finish: Finish) -> dict:
    reason = STOP_REASONS.get(finish.reason, "stop_sequence" if finish.stop_sequence else "end_turn")
    return {"stop_reason": reason, "stop_sequence": finish.stop_sequence if reason == "stop_sequence" else None}


def usage_json(u: Usage) -> dict:
    """Anthropic counts cached prompt tokens apart: input_tokens are the ones computed afresh."""
    out = {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
           "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0,
           "output_tokens_details": {"thinking_tokens": u.reasoning_tokens}}
    if u.speculation is not None:
        out["speculation"] = speculation_json(u.speculation)
    return out


def signature(thinking: str) -> str:
    """Thinking blocks carry a signature; clients send it back unchanged and this server does not check it."""
    return "qwendesk-" + hashlib.sha256(thinking.encode("utf-8", "replace")).hexdigest()[:32]
