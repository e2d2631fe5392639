"""Server-sent events and JSON bodies, encoded so that no text can fail to encode."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def dumps(data) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def encode(text: str) -> bytes:
    # a lone surrogate (a client can send one as "\ud800") becomes "?" rather than an error
    return text.encode("utf-8", errors="replace")


def event(data, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return encode(f"{head}data: {data if isinstance(data, str) else dumps(data)}\n\n")


class ChunkTemplate:
    """The streamed chunks of one reply differ only in their choice's index and one field (`delta` or `text`),
    as long as they carry no logprobs and no finish reason: the JSON around those is encoded once, and a
    chunk costs one small dumps instead of the whole object's (the same bytes)."""

    def __init__(self, meta: dict, field: str, with_usage: bool):
        self.head = "data: " + dumps(meta)[:-1] + ',"choices":[{"index":'
        self.field = f',"{field}":'
        self.tail = ',"logprobs":null,"finish_reason":null}]' + (',"usage":null}' if with_usage else "}") + "\n\n"

    def __call__(self, index: int, value_json: str) -> bytes:
        return encode(f"{self.head}{index}{self.field}{value_json}{self.tail}")


def comment(text: str = "keep-alive") -> bytes:
    return encode(f": {text}\n\n")


def sse_response(stream, gens) -> StreamingResponse:
    """`gens`: the generations the stream reads, cancelled when the response ends, even one that
    ended before the stream began (the client left at once) and so never ran its own clean-up.
    A stream that ends before its last event went out was dropped by the client."""
    outcome = gens[0].outcome

    async def whole():
        async for chunk in stream:
            yield chunk
        outcome.end()

    def cancel():
        outcome.end("dropped")              # (nothing if it ended whole)
        for gen in gens:
            gen.cancel()

    return StreamingResponse(whole(), media_type="text/event-stream", headers=SSE_HEADERS,
                             background=BackgroundTask(cancel))


class JSON(JSONResponse):
    def render(self, content) -> bytes:
        return encode(dumps(content))
