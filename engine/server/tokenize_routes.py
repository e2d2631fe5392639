"""POST /tokenize and /detokenize, as vLLM spells them (llama.cpp's servers offer the same): a text (or a chat, through
the chat template, exactly as /v1/chat/completions would prompt the model) -> token ids, and back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from engine.server.http.body import documented, parse_body
from engine.server.http.errors import APIError
from engine.server.openai.convert import chat_request
from engine.server.openai.schema import ChatCompletionRequest, ChatMessage, Tool
from engine.server.bridge.prompting import encode, prompt_ids
from engine.server.http.sse import JSON

router = APIRouter()


class TokenizeRequest(BaseModel):
    """`prompt`: a text as /v1/completions takes it; or `messages` (+ `tools`, `chat_template_kwargs`): a chat as
    /v1/chat/completions renders it, generation prompt included. `model` may be left out, as vLLM's allows."""
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


@router.post("/tokenize", openapi_extra=documented(TokenizeRequest))
async def tokenize(request: Request):
    server = request.app.state.server
    body = await parse_body(request, TokenizeRequest)
    engine = server.ready()
    if body.model is not None:
        server.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give either prompt (a text) or messages (a chat)", param="prompt")
    if body.prompt is not None:
        ids = await server.workers.run(encode, engine.tokenizer, body.prompt, engine.max_context)
    else:
        chat = ChatCompletionRequest(model=server.settings.model_id, messages=body.messages, tools=body.tools,
                                     chat_template_kwargs=body.chat_template_kwargs)
        req = chat_request(chat, engine.model_config.vocab_size, server.image_options())
        req.special_text = server.settings.special_text
        ids, _ = await server.workers.run(prompt_ids, engine, req)
    out = {"count": len(ids), "max_model_len": engine.max_context, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [engine.tokenizer.id_to_token(i) for i in ids]
    return JSON(out)


@router.post("/detokenize", openapi_extra=documented(DetokenizeRequest))
async def detokenize(request: Request):
    server = request.app.state.server
    body = await parse_body(request, DetokenizeRequest)
    engine = server.ready()
    if body.model is not None:
        server.check_model(body.model)
    vocab = engine.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="tokens")
    return JSON({"prompt": await server.workers.run(engine.tokenizer.decode, body.tokens)})
