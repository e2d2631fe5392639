"""Generation: one engine request seen from asyncio, as output events.

Iterating a RequestHandle blocks, so a small thread per request pumps its events into an asyncio
queue. The engine's pieces (Text, Reasoning, CallStart, CallArgs: it parses the calls when the request
has tools) pass straight through, with the logprobs of the tokens the engine labelled content. Leaving
`events()` early (the client went away) cancels the engine request, which frees its cache pages at once.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from engine.api import CallArgs, CallStart, Reasoning, StreamEvent, Text, Timings, TokenLogprob, Usage
from engine.server.errors import CLIENT_CLOSED, APIError
from engine.server.prompting import Prompt


@dataclass
class Logprobs:
    items: list[TokenLogprob]


@dataclass
class Keepalive:
    """Nothing new for a while (queued, or a long prefill): lets the client know the stream is alive."""


@dataclass
class Finish:
    reason: str                     # stop | length | tool_calls | cancelled | error
    usage: Usage
    timings: Timings | None = None
    stop_sequence: str | None = None
    error: str | None = None

    def api_error(self) -> APIError | None:
        """Why a generation did not complete, as the error the client gets (None: it completed)."""
        if self.reason == "error":
            return APIError(500, f"generation failed: {self.error}", "server")
        if self.reason == "cancelled":
            return APIError(503, "the request was cancelled: the server is shutting down", "unavailable")
        return None


class Generation:
    def __init__(self, engine, prompt: Prompt, *, keepalive_s: float = 15.0, raw: bool = False, metrics=None):
        """`raw`: a plain completion: reasoning is part of the text (its prompt has no tools to parse)."""
        self.engine, self.prompt, self.params = engine, prompt, prompt.params
        self.keepalive_s, self.raw, self.metrics = keepalive_s, raw, metrics
        self.shown = ("content", "reasoning") if raw else ("content",)    # the tokens whose logprobs go out
        self.finished = False
        self.handle = engine.submit(prompt.ids, self.params, tools=prompt.tools,   # raises QueueFullError, ValueError
                                    images=prompt.images or None)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, name=f"qwendesk-stream-{self.handle.id}", daemon=True).start()

    def cancel(self) -> None:
        if not self.finished:
            self.handle.cancel()

    async def events(self):
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(self.queue.get(), self.keepalive_s)
                except asyncio.TimeoutError:
                    yield Keepalive()
                    continue
                for out in self._convert(ev):
                    yield out
                if ev.kind == "finish":
                    return
        finally:
            self.cancel()

    # ---- engine events -> output events --------------------------------------------------------
    def _pump(self) -> None:
        for ev in self.handle:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)
            except RuntimeError:            # the event loop is gone (server shutting down)
                self.handle.cancel()

    def _convert(self, ev: StreamEvent) -> list:
        out = []
        if ev.logprobs and self.params.logprobs is not None:
            items = [lp for lp, kind in zip(ev.logprobs, ev.token_kinds) if kind in self.shown]
            if items:
                out.append(Logprobs(items))
        out += [Text(p.text) if self.raw and isinstance(p, Reasoning) else p for p in ev.pieces]
        if ev.kind == "finish":
            out.append(self._finish(ev))
        return out

    def _finish(self, ev: StreamEvent) -> Finish:
        self.finished = True
        usage = ev.usage or Usage(prompt_tokens=len(self.prompt.ids))
        if self.metrics is not None:
            self.metrics.finished(ev.finish_reason, usage, ev.timings)
        return Finish(ev.finish_reason, usage, ev.timings, ev.stop_sequence, ev.error)


@dataclass
class Reply:
    """A whole generation, for the non-streaming responses: blocks in the order they came."""
    blocks: list = field(default_factory=list)    # ["thinking", text] | ["text", text] | ["tool", name, args]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: Finish | None = None

    @property
    def reasoning(self) -> str:
        return "".join(b[1] for b in self.blocks if b[0] == "thinking")

    @property
    def text(self) -> str:
        return "".join(b[1] for b in self.blocks if b[0] == "text")

    @property
    def calls(self) -> list[tuple[str, str]]:
        return [(b[1], b[2]) for b in self.blocks if b[0] == "tool"]


async def collect(gen: Generation) -> Reply:
    """Run a generation to its end."""
    reply, calls = Reply(), {}
    async for ev in gen.events():
        kind = {Reasoning: "thinking", Text: "text"}.get(type(ev))
        if kind:
            if reply.blocks and reply.blocks[-1][0] == kind:
                reply.blocks[-1][1] += ev.text
            else:
                reply.blocks.append([kind, ev.text])
        elif isinstance(ev, CallStart):
            calls[ev.index] = ["tool", ev.name, ""]
            reply.blocks.append(calls[ev.index])
        elif isinstance(ev, CallArgs):
            calls[ev.index][2] += ev.text
        elif isinstance(ev, Logprobs):
            reply.logprobs += ev.items
        elif isinstance(ev, Finish):
            reply.finish = ev
    return reply


async def collect_all(request, gens: list[Generation], consume=collect) -> list:
    """Run generations to their end (`consume(gen)`: what a generation's events become; a Reply by
    default); cancel them all if the client disconnects first (a response that is not streamed has no
    other way to notice). The client gone, the request ends as a CLIENT_CLOSED error: nobody reads it, and /metrics
    counts it apart from the server's own failures (not as the 503 of a cancel at shutdown)."""
    gone = asyncio.Event()

    async def watch():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()
        for gen in gens:
            gen.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        replies = list(await asyncio.gather(*(consume(g) for g in gens)))
    finally:
        watcher.cancel()
    if gone.is_set():
        raise APIError(CLIENT_CLOSED, "the client closed the connection before the reply")
    return replies


async def merged(gens: list[Generation]):
    """(index, event) from several generations as they come; leaving early cancels them all."""
    queue: asyncio.Queue = asyncio.Queue()

    async def run(i: int, gen: Generation):
        try:
            async for ev in gen.events():
                queue.put_nowait((i, ev))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(run(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
        while left:
            i, ev = await queue.get()
            if ev is None:
                left -= 1
            else:
                yield i, ev
    finally:
        for task in tasks:
            task.cancel()
