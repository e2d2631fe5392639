"""OpenAI routes: POST /v1/chat/completions and POST /v1/completions, streamed or not."""

from __future__ import annotations

import secrets
import time
from typing import Any, cast

from fastapi import APIRouter, Request

from engine.api import CallArgs, CallStart, Reasoning, Text, TokenLogprob, Usage
from engine.server.http.body import documented, parse_body
from engine.server.bridge.checks import OPENAI_COMPLETIONS, refuse_unsupported
from engine.server.http.errors import APIError, error_payload
from engine.server.bridge.generation import Finish, Keepalive, Logprobs, Reply, collect_all, merged
from engine.server.openai.logprobs import chat_logprobs, completion_logprobs, prompt_logprobs
from engine.server.openai.convert import chat_request, sampling_fields
from engine.server.openai.schema import ChatCompletionRequest, CompletionRequest
from engine.server.bridge.prompting import Prompt, chat_prompts, completion_room, encode, sampling_params
from engine.server.bridge.structured import response_constraint
from engine.server.http.sse import JSON, ChunkTemplate, comment, dumps, event, sse_response

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=documented(ChatCompletionRequest))
async def chat_completions(request: Request):
    server = request.app.state.server
    body = await parse_body(request, ChatCompletionRequest)
    engine = server.ready()
    server.check_model(body.model)
    req = chat_request(body, engine.model_config.vocab_size, server.image_options())
    req.special_text = server.settings.special_text
    prompts = await server.workers.run(chat_prompts, engine, req, server.defaults, body.n or 1)
    gens = await server.start([prompts])
    meta = {"id": "chatcmpl-" + secrets.token_hex(12), "created": int(time.time()), "model": body.model}
    legacy = body.functions is not None or body.function_call is not None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(chat_stream(gens, meta, include_usage, server.token_bytes, legacy), gens)
    replies = await collect_all(request, gens)
    for reply in replies:
        if reply.finish.api_error():
            raise reply.finish.api_error()
    choices = [{"index": i, "message": chat_message(r, legacy), "finish_reason": finish_reason(r.finish, legacy),
                "logprobs": chat_logprobs(r.logprobs, server.token_bytes) if prompts[0].params.logprobs is not None
                else None} for i, r in enumerate(replies)]
    return JSON({**meta, "object": "chat.completion", "choices": choices,
                 "usage": usage_json(samples_usage([r.finish.usage for r in replies]))})


def finish_reason(finish: Finish, legacy: bool) -> str:
    return "function_call" if legacy and finish.reason == "tool_calls" else finish.reason


def chat_message(reply: Reply, legacy: bool = False) -> dict:
    """`legacy`: the request used `functions`, so its (one) call goes out as `function_call`."""
    calls = [{"id": "call_" + secrets.token_hex(12), "type": "function", "function": {"name": n, "arguments": a}}
             for n, a in reply.calls]
    message: dict[str, Any] = {"role": "assistant", "content": reply.text if reply.text or not calls else None,
                               "refusal": None}
    if reply.reasoning:
        message["reasoning_content"] = message["reasoning"] = reply.reasoning
    if calls and legacy:
        message["function_call"] = calls[0]["function"]
    elif calls:
        message["tool_calls"] = calls
    return message


async def chat_stream(gens, meta: dict, include_usage: bool, token_bytes, legacy: bool = False):
    def chunk(i: int, delta: dict, finish: str | None = None, logprobs=None) -> bytes:
        if finish is None and logprobs is None:
            return text_chunk(i, dumps(delta))
        data = {**meta, "object": "chat.completion.chunk",
                "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        return event({**data, "usage": None} if include_usage else data)

    text_chunk = ChunkTemplate({**meta, "object": "chat.completion.chunk"}, "delta", include_usage)

    def call_delta(index: int, function: dict, call_id: str | None = None) -> dict:
        if legacy:
            return {"function_call": function}
        call = {"index": index, "function": function}
        return {"tool_calls": [{**call, "id": call_id, "type": "function"} if call_id else call]}

    for i in range(len(gens)):
        yield chunk(i, {"role": "assistant", "content": ""})
    pending: dict[int, list] = {}                   # logprobs waiting for the text they belong to
    usages = []
    async for i, ev in merged(gens):
        if isinstance(ev, Logprobs):
            pending.setdefault(i, []).extend(ev.items)
            continue
        lp = chat_logprobs(pending.pop(i), token_bytes) if i in pending and not isinstance(ev, Keepalive) else None
        if isinstance(ev, Reasoning):
            yield chunk(i, {"reasoning_content": ev.text, "reasoning": ev.text}, logprobs=lp)
        elif isinstance(ev, Text):
            yield chunk(i, {"content": ev.text}, logprobs=lp)
        elif isinstance(ev, CallStart):
            yield chunk(i, call_delta(ev.index, {"name": ev.name, "arguments": ""}, "call_" + secrets.token_hex(12)),
                        logprobs=lp)
        elif isinstance(ev, CallArgs):
            yield chunk(i, call_delta(ev.index, {"arguments": ev.text}), logprobs=lp)
        elif isinstance(ev, Keepalive):
            yield comment()
        elif isinstance(ev, Finish):
            if (error := ev.api_error()) is not None:    # leaving cancels the other samples
                yield event(error_payload(error, "openai")[1])
                break
            yield chunk(i, {}, finish_reason(ev, legacy), logprobs=lp)
            usages.append(ev.usage)
    else:
        if include_usage:
            yield event({**meta, "object": "chat.completion.chunk", "choices": [],
                         "usage": usage_json(samples_usage(usages))})
    yield event("[DONE]")


@router.post("/v1/completions", openapi_extra=documented(CompletionRequest))
async def completions(request: Request):
    server = request.app.state.server
    body = await parse_body(request, CompletionRequest)
    engine = server.ready()
    server.check_model(body.model)
    refuse_unsupported(body.model_dump(), OPENAI_COMPLETIONS)
    n = body.n or 1
    groups = await server.workers.run(completion_prompts, engine, body, server.defaults, n)
    scored = []                     # each choice's prompt logprobs (echo with logprobs)
    if body.echo and body.logprobs is not None:
        for group in groups:
            scored += [await server.workers.run(prompt_logprobs, engine, group[0].ids, body.logprobs)] * len(group)
    gens = await server.start(groups, raw=True)
    tok = engine.tokenizer
    echoes = [tok.decode(group[0].ids) if body.echo else "" for group in groups for _ in group]
    meta = {"id": "cmpl-" + secrets.token_hex(12), "created": int(time.time()), "model": body.model}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(completion_stream(gens, meta, echoes, include_usage, server.token_bytes, n, scored), gens)
    replies = await collect_all(request, gens)
    for reply in replies:
        if reply.finish.api_error():
            raise reply.finish.api_error()
    choices = [{"index": i, "text": echoes[i] + r.text, "finish_reason": r.finish.reason,
                "logprobs": completion_logprobs((scored[i] if scored else []) + r.logprobs, server.token_bytes,
                                                0 if scored else len(echoes[i]))
                if body.logprobs is not None else None} for i, r in enumerate(replies)]
    usages = [r.finish.usage for r in replies]
    return JSON({**meta, "object": "text_completion", "choices": choices,
                 "usage": usage_json(total_usage([samples_usage(usages[k:k + n]) for k in range(0, len(usages), n)]))})


def completion_prompts(engine, body: CompletionRequest, defaults: dict, n: int) -> list[list[Prompt]]:
    """Each prompt (text or token ids) as the engine takes it (no chat template), as its n samples (each with its own
    processors, and its own seed: seed + i when the client gave one)."""
    # one prompt is a str or token ids (the schema checked the shapes)
    one = isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int))
    given = cast("list[str | list[int]]", [body.prompt] if one else body.prompt)
    if not given:
        raise APIError(400, "prompt is empty", param="prompt")
    tok, groups = engine.tokenizer, []
    for text_or_ids in given:
        ids = encode(tok, text_or_ids, engine.max_context) if isinstance(text_or_ids, str) else list(text_or_ids)
        if not ids:
            raise APIError(400, "prompt is empty", param="prompt")
        bad = [t for t in ids if not 0 <= t < engine.model_config.vocab_size]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary", param="prompt")
        fields = sampling_fields(body, engine.model_config.vocab_size)
        group = []
        for i in range(n):
            params = sampling_params({**fields, "logprobs": body.logprobs}, defaults)
            params.max_tokens = completion_room(engine, len(ids), body.max_tokens)
            params.constraint = response_constraint(body.response_format)
            if params.seed is not None:
                params.seed = (params.seed + i) % 2 ** 63
            group.append(Prompt(list(ids), params, tools=None))
        groups.append(group)
    return groups


async def completion_stream(gens, meta: dict, echoes: list[str], include_usage: bool, token_bytes, n: int = 1,
                            scored: list | None = None):
    """`scored`: each choice's prompt logprobs, sent with its echo."""
    def chunk(i: int, text: str, finish: str | None = None, logprobs=None) -> bytes:
        if finish is None and logprobs is None:
            return text_chunk(i, dumps(text))
        data = {**meta, "object": "text_completion",
                "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
        return event({**data, "usage": None} if include_usage else data)

    text_chunk = ChunkTemplate({**meta, "object": "text_completion"}, "text", include_usage)

    offsets = [len(e) for e in echoes]
    for i, echo in enumerate(echoes):
        if echo:
            yield chunk(i, echo, logprobs=completion_logprobs(scored[i], token_bytes) if scored else None)
    usages: dict[int, list[Usage]] = {}                  # prompt -> its samples' usages
    pending: dict[int, list[TokenLogprob]] = {}          # sample -> its logprobs not yet sent
    async for i, ev in merged(gens):
        if isinstance(ev, Logprobs):
            pending.setdefault(i, []).extend(ev.items)
        elif isinstance(ev, Text):
            lp = completion_logprobs(pending.pop(i), token_bytes, offsets[i]) if i in pending else None
            offsets[i] += len(ev.text)
            yield chunk(i, ev.text, logprobs=lp)
        elif isinstance(ev, Keepalive):
            yield comment()
        elif isinstance(ev, Finish):
            if (error := ev.api_error()) is not None:    # leaving cancels the other prompts
                yield event(error_payload(error, "openai")[1])
                break
            lp = completion_logprobs(pending.pop(i), token_bytes, offsets[i]) if i in pending else None
            yield chunk(i, "", ev.reason, logprobs=lp)
            usages.setdefault(i // n, []).append(ev.usage)
    else:
        if include_usage:
            yield event({**meta, "object": "text_completion", "choices": [],
                         "usage": usage_json(total_usage([samples_usage(u) for u in usages.values()]))})
    yield event("[DONE]")


def usage_json(u: Usage) -> dict:
    """With speculative decoding, the drafts kept and thrown away are OpenAI's accepted / rejected prediction
    tokens, and `speculation` says per round and per draft position how it went."""
    details = {"reasoning_tokens": u.reasoning_tokens}
    out: dict[str, Any] = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                           "total_tokens": u.prompt_tokens + u.completion_tokens,
                           "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
                           "completion_tokens_details": details}
    if u.speculation is not None:
        spec = u.speculation
        details.update(accepted_prediction_tokens=spec.accepted,
                                                rejected_prediction_tokens=spec.drafted - spec.accepted)
        out["speculation"] = speculation_json(spec)
    return out


def speculation_json(s) -> dict:
    return {"rounds": s.rounds, "drafted_tokens": s.drafted, "accepted_tokens": s.accepted,
            "method": s.method, "tokens_per_round": round(s.tokens_per_round, 3),
            "position_rates": [round(r, 3) for r in s.position_rates]}


def samples_usage(usages: list[Usage]) -> Usage:
    """The usage of n samples of one prompt: the prompt counted once (as its first sample, the one that
    computed it, saw it), the generated tokens of all."""
    if len(usages) == 1:
        return usages[0]
    first = usages[0]
    return Usage(first.prompt_tokens, sum(u.completion_tokens for u in usages), first.cached_tokens,
                 sum(u.reasoning_tokens for u in usages))


def total_usage(usages: list[Usage]) -> Usage:
    return Usage(*(sum(getattr(u, f) for u in usages) for f in
                   ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")))
