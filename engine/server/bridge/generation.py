"""Generation: one engine request seen from asyncio, as output events.

The engine tells the event loop when a request has new events (`Wakeups`: one wake-up per engine step for
all of them) and the generation reads what its handle holds. The engine's pieces (Text, Reasoning, CallStart, CallArgs:
it parses the calls when the request has tools) pass straight through, with the logprobs of the tokens the engine
labelled content. Leaving
`events()` early (the client went away) cancels the engine request, which frees its cache pages at once.

The tokens a generation used are counted in the metrics when the engine finishes it, whether or not anyone
still reads it (a stream cut midway counts as much as one read to its end); how the HTTP request ended
(completed, failed, abandoned, dropped) is its `Outcome`'s business.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from engine.api import (CallArgs, CallStart, FinishReason, Piece, Reasoning, StreamEvent, Text, Timings, TokenLogprob,
                        Usage)
from engine.server.http.errors import APIError, ClientGone
from engine.server.http.metrics import Outcome
from engine.server.bridge.prompting import Prompt


@dataclass
class Logprobs:
    items: list[TokenLogprob]


@dataclass
class Keepalive:
    """Nothing new for a while (queued, or a long prefill): lets the client know the stream is alive."""


@dataclass
class Finish:
    reason: FinishReason
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


class Wakeups:
    """From the engine's thread to the event loop: the generations that have new events.

    Every hop between threads is a fight for the GIL with the engine loop, so: no thread per request, and
    nothing on the engine's thread that lets go of the GIL (waking the event loop writes to its self-pipe,
    which does). The engine's thread only notes the generation and sets an Event; one waker thread, which
    gets the GIL when the engine's thread lets go of it (waiting for the GPU), wakes the loop once for all
    the requests that had events by then: one wake-up per engine step however many requests run."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list[Generation] = []
        self.ready = threading.Event()
        threading.Thread(target=self._waker, name="qwendesk-wakeups", daemon=True).start()

    def notify(self, gen: Generation) -> None:          # the engine's thread
        with self.lock:
            self.pending.append(gen)
            first = len(self.pending) == 1
        if first:                                       # (else a wake-up is already on its way)
            self.ready.set()

    def _waker(self) -> None:
        while not self.loop.is_closed():                # (the server stopped: the thread ends)
            if not self.ready.wait(1.0):
                continue
            self.ready.clear()
            try:
                self.loop.call_soon_threadsafe(self._wake)
            except RuntimeError:                        # the event loop is gone (server shutting down)
                with self.lock:
                    gens, self.pending = self.pending, []
                for gen in gens:
                    gen.handle.cancel()
                return

    def _wake(self) -> None:                            # the loop's thread
        with self.lock:
            gens, self.pending = self.pending, []
        for gen in gens:
            gen.wake.set()
            gen.started.set()


class Generation:
    def __init__(self, engine, prompt: Prompt, wakeups: Wakeups, *, keepalive_s: float = 15.0, interval_s: float = 0.0,
                 raw: bool = False, metrics=None):
        """`raw`: a plain completion: reasoning is part of the text (its prompt has no tools to parse).
        `interval_s`: after output, wait this long before reading again (what came meanwhile goes out merged)."""
        self.engine, self.prompt, self.params = engine, prompt, prompt.params
        self.keepalive_s, self.interval_s, self.raw = keepalive_s, interval_s, raw
        self.metrics, self.wakeups = metrics, wakeups
        self.shown = ("content", "reasoning") if raw else ("content",)    # the tokens whose logprobs go out
        self.finished = False
        self.outcome: Outcome | None = None     # the HTTP request's, once all its generations started
        self.wake = asyncio.Event()             # the handle has events to read
        self.started = asyncio.Event()          # set when the first event comes: the prompt is in the cache
        self.handle = engine.submit(prompt.ids, self.params, tools=prompt.tools,   # raises QueueFullError, ValueError
                                    images=prompt.images or None, on_event=self._on_event)

    def cancel(self) -> None:
        if not self.finished:
            self.handle.cancel()

    def _on_event(self, ev: StreamEvent) -> None:       # the engine's thread
        if ev.kind == "finish" and self.metrics is not None:
            self.metrics.finished(ev.finish_reason, ev.usage or Usage(prompt_tokens=len(self.prompt.ids)), ev.timings)
        self.wakeups.notify(self)

    async def events(self):
        """Output events; what came since the last wake-up arrives merged (one Text for several tokens' text),
        so a client that reads slower than the engine writes gets fewer, larger chunks."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                batch = self.handle.ready()
                if not batch:
                    # a wake-up can come late, for events this loop has read already: only the deadline sends a
                    # keep-alive
                    deadline = loop.time() + self.keepalive_s
                    while not batch and loop.time() < deadline:
                        self.wake.clear()
                        timer = loop.call_at(deadline, self.wake.set)
                        await self.wake.wait()
                        timer.cancel()
                        batch = self.handle.ready()
                    if not batch:
                        yield Keepalive()
                        continue
                for out in self._convert(batch):
                    yield out
                if batch[-1].kind == "finish":
                    return
                if self.interval_s:
                    await asyncio.sleep(self.interval_s)
        finally:
            self.cancel()

    # ---- engine events -> output events --------------------------------------------------------
    def _convert(self, batch: list[StreamEvent]) -> list[Logprobs | Piece | Finish]:
        out: list[Logprobs | Piece | Finish] = []
        for ev in batch:
            if ev.logprobs and self.params.logprobs is not None:
                items = [lp for lp, kind in zip(ev.logprobs, ev.token_kinds) if kind in self.shown]
                if items:
                    out.append(Logprobs(items))
            for p in ev.pieces:
                p = Text(p.text) if self.raw and isinstance(p, Reasoning) else p
                one = joined(out[-1], p) if out else None
                if one is not None:
                    out[-1] = one
                else:
                    out.append(p)
            if ev.kind == "finish":
                out.append(self._finish(ev))
        return out

    def _finish(self, ev: StreamEvent) -> Finish:
        self.finished = True
        usage = ev.usage or Usage(prompt_tokens=len(self.prompt.ids))
        assert ev.finish_reason is not None, "a finish event has its reason"
        finish = Finish(ev.finish_reason, usage, ev.timings, ev.stop_sequence, ev.error)
        if finish.api_error() is not None and self.outcome is not None:
            self.outcome.failed = True
        return finish


def joined(a: Logprobs | Piece | Finish, b: Piece) -> Piece | None:
    """Two pieces that go out as one, joined (text after text, thinking after thinking, a call's arguments after its
    own); None when they do not."""
    if isinstance(a, CallArgs) and isinstance(b, CallArgs):
        return CallArgs(b.index, a.text + b.text) if a.index == b.index else None
    if isinstance(a, Text) and isinstance(b, Text):
        return Text(a.text + b.text)
    if isinstance(a, Reasoning) and isinstance(b, Reasoning):
        return Reasoning(a.text + b.text)
    return None


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


async def collect(events) -> Reply:
    """Run a generation's events to their end."""
    reply, calls = Reply(), {}
    async for ev in events:
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


async def collect_all(request, gens: list[Generation], consume=None) -> list:
    """Run generations to their end (`consume(gen)`: what a generation's events become; a Reply by
    default); cancel them all and raise ClientGone if the client disconnects first (a response that is
    not streamed has no other way to notice)."""
    consume = consume or (lambda gen: collect(gen.events()))
    gone = False

    async def watch():
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        for gen in gens:
            gen.cancel()

    watcher = asyncio.ensure_future(watch())
    outcome = gens[0].outcome
    assert outcome is not None                  # set once all the request's generations started
    try:
        results = list(await asyncio.gather(*(consume(g) for g in gens)))
    finally:
        watcher.cancel()
    if gone:
        outcome.end("abandoned")
        raise ClientGone()
    outcome.end()
    return results


async def merged(gens: list[Generation]):
    """(index, event) from several generations as they come; leaving early cancels them all."""
    if len(gens) == 1:
        async for ev in gens[0].events():
            yield 0, ev
        return
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
