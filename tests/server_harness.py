"""Shared by the server tests: a real uvicorn server on a free loopback port around a tiny engine,
a params hook that scripts what the model says, and a raw HTTP client for what SDKs cannot send."""

from __future__ import annotations

import http.client
import json
import time
from contextlib import contextmanager

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.server import ServerSettings, ServerThread, create_app

MODEL = "tiny-qwen"


def make_engine(path, **kw) -> Engine:
    kw = {"device": "cpu", "dtype": "float32", "max_context": 1024, "page_size": 16, **kw}
    return Engine(EngineConfig(model=str(path), **kw))


class Script:
    """Forces the output to be `ids`, then the stop token; yields to a token the server forces."""

    def __init__(self, ids: list[int], eos: int):
        self.ids = ids + [eos]

    def __call__(self, output, logits):
        if len(output) >= len(self.ids) or int(torch.isfinite(logits).sum()) == 1:
            return logits
        forced = torch.full_like(logits, float("-inf"))
        forced[self.ids[len(output)]] = 0.0
        return forced


class Ban:
    def __init__(self, ids, delay: float = 0.0):
        self.ids, self.delay = list(ids), delay

    def __call__(self, output, logits):
        if self.delay:
            time.sleep(self.delay)
        if int(torch.isfinite(logits).sum()) > 1:   # a server processor forcing a token (a call's end) wins
            logits[self.ids] = float("-inf")
        return logits


def fail(output, logits):
    raise RuntimeError("scripted failure")


class Steering:
    """The server's params hook in tests. `say(text)`: the model's next replies are exactly `text`
    (with thinking on, a reply starts inside <think>: write "...</think>\\n\\nanswer"). `endless()`:
    the model never stops or closes its thinking by itself (each token `delay` seconds; a token that the server
    forces, like the end of a reply after its one tool call, still goes through). `failing`:
    the engine's step raises (every request in flight ends with finish_reason "error")."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.reset()

    def reset(self):
        self.text, self.ban, self.delay, self.seen, self.failing = None, [], 0.0, [], False

    def say(self, text: str):
        self.text = text

    def endless(self, delay: float = 0.0):
        self.ban = list(self.tok.eos_token_ids) + [self.tok.think_end_id]
        self.delay = delay

    def __call__(self, params):
        self.seen.append(params)
        if self.text is not None:
            params.logits_processors.append(Script(self.tok.encode(self.text), self.tok.eos_token_ids[0]))
        if self.ban:
            params.logits_processors.append(Ban(self.ban, self.delay))
        if self.failing:
            params.logits_processors.append(fail)


@contextmanager
def serving(engine, hook=None, **settings):
    settings.setdefault("model_id", MODEL)
    server = ServerThread(create_app(ServerSettings(**settings), engine, params_hook=hook), port=0).start()
    try:
        yield server
    finally:
        server.stop()


def raw(server, method: str, path: str, body=None, headers=None, timeout: float = 60):
    """-> (status, headers dict, body bytes). `body`: bytes as is, anything else as JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each server-sent event in a body."""
    events = []
    for block in body.decode().split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            events.append((name, "\n".join(data)))
    return events


def wait_idle(engine, timeout: float = 10.0) -> dict:
    """Wait until nothing runs or waits and no page is held; returns the last stats."""
    deadline = time.monotonic() + timeout
    while True:
        s = engine.stats()
        if (s["running"] == 0 and s["waiting"] == 0 and s["kv_pages_used"] == 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


# Module-scoped fixtures for a server test module: import them (engine, steer, server, reset) into
# the module; set ENGINE_PROFILE there to change the engine's profile.
@pytest.fixture(scope="module")
def engine(request, checkpoint):
    e = make_engine(checkpoint("base"), profile=getattr(request.module, "ENGINE_PROFILE", "C1"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def steer(engine):
    return Steering(engine.tokenizer)


@pytest.fixture(scope="module")
def server(engine, steer):
    with serving(engine, steer) as s:
        yield s


@pytest.fixture(autouse=True)
def reset(steer):
    steer.reset()
    yield
