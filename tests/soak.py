"""Soak: many mixed requests from several clients against a real `qwendesk-serve` process, then the checks.

    python -m tests.soak --requests 2000 --clients 12 --json soak.json
    python -m tests.soak --shape 27b --weights int4 --device cuda ...     # on a GPU: docs/reliability.md

The server runs as its own process (profile C8, the host tier small so that it spills and evicts, the disk tier on
in a temporary folder), on a tiny random checkpoint written for the run unless --model names one. With --shape it
serves random weights at that shape (27b, or tiny on the CPU) with the real Qwen3.5 vocabulary and chat template,
through tests/random_serve.py: qwendesk-serve with the model built in place, no checkpoint written. The requests mix
OpenAI chat completions, plain completions, the Responses API and Anthropic messages; tools with tool_choice auto
and required, structured output (json_schema), short prompts and long ones, many sharing a conversation's prefix,
and many the next turn of an earlier one, old or recent (a stored response continued, or a finished chat sent again
with its reply and a new question: prefix hits from each tier); half are streamed. One in five is dropped by its
client (the socket reset before the reply, or in the middle of a stream) and some streams are cancelled the way the
SDKs cancel one (the connection closed after a few events).

Checks: no 5xx (seen by the clients or counted by the server), every request that was not dropped answered 200 with
a well-formed reply that ended as its protocol ends, none past its deadline (hung), the server's log without a
traceback; afterwards the engine back to its baseline (nothing running or waiting, no KV page or state slot held,
the host and disk tiers within their budgets, the pinned host memory within the host tier's budget and the disk
tier's write staging (and PINNED_SLACK_MB), the disk tier's folder holding exactly the bytes it counts and no
temporary file); the server's RSS flat after the warm-up (first, after warm-up, max and last samples of VmRSS, less
the pinned host memory torch holds: the host tier's slabs, which its budget bounds, and the disk writer's staging,
one buffer of its bound; on the CPU the host tier's bytes), and
its GPU memory allocated (torch's allocator, from /metrics; 0 on the CPU) idle at the end as it was idle after the
warm-up (the clients pause once the warm-up's requests are sent, until the server is idle).
Prints a table and writes the whole report as JSON. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
MODEL_ID = "tiny"
START_TIMEOUT_S = 600                   # a 27B random model builds, tunes its kernels and warms up: ~2 min when cold
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "count": {"type": "integer"}},
          "required": ["name", "count"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "days": {"type": "integer"}}, "required": ["city"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                  "parameters": WEATHER}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                    "parameters": WEATHER}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
GAUGES = ("running", "waiting", "kv_pages_used", "kv_pages_cached", "kv_pages_total", "state_slots_used",
          "snapshots_cached", "host_cache_pages", "host_cache_snapshots", "host_cache_bytes", "disk_cache_pages",
          "disk_cache_snapshots", "disk_cache_bytes", "disk_cache_staging_bytes", "gpu_memory_allocated_bytes",
          "gpu_memory_reserved_bytes", "pinned_host_memory_bytes")
PINNED_SLACK_MB = 256      # pinned memory beside the host tier and the disk tier's staging: small transfer buffers


@dataclass
class Options:
    requests: int = 2000
    clients: int = 12
    seed: int = 0
    model: str | None = None            # a checkpoint directory (default: a tiny random one, written for the run)
    shape: str | None = None            # instead: random weights at this shape (27b, 9b, tiny; tests/random_serve.py)
    weights: str = "int4"               # with --shape: int4 | bf16
    device: str = "cpu"
    profile: str = "C8"
    max_context: int = 4096
    max_tokens: int = 48                # each request's max_tokens is drawn from 4 .. this
    conversations: int = 48             # half the requests share one of these conversations' system prompt and history
    host_cache_gb: float = 0.004        # small: pages spill to host memory and are evicted from it
    disk_cache_gb: float = 0.05
    deadline_s: float = 60.0            # a request not finished by then is hung
    warmup: float = 0.2                 # share of the requests before a pause (idle); RSS and GPU memory settle by then
    rss_tolerance_mb: float = 64.0      # growth allowed after the warm-up (and 10% of the settled RSS, if more)
    gpu_tolerance_mb: float = 64.0      # GPU memory allocated: growth allowed from idle after the warm-up to the end
    time_limit_s: float = 0.0           # no request handed out after this long (0: none); the checks cover those sent
    server_threads: int = 1             # OMP_NUM_THREADS of the server (0: torch's default; see docs/reliability.md)
    workdir: str | None = None          # where the checkpoint, the disk tier and the server log go (default: temp)


@dataclass
class Request:
    index: int
    kind: str                           # chat | completions | responses | messages
    stream: bool
    fate: str                           # answer | drop_before | drop_mid | cancel
    feature: str                        # plain | tools_auto | tools_required | json_schema
    long: bool
    conversation: int | None
    max_tokens: int
    chain: bool = False                 # continue an earlier reply: a stored response (previous_response_id), or a
    #                                     finished chat sent again with its reply and a new question


@dataclass
class Outcome:
    index: int
    kind: str
    stream: bool
    fate: str
    feature: str
    status: int | None = None
    seconds: float = 0.0
    hung: bool = False
    error: str = ""                     # why the reply is wrong (empty: fine)
    finish: str = ""


# ---- the request mix ---------------------------------------------------------------------------------
def plan(n: int, seed: int, max_tokens: int = 48, conversations: int = 48) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choices(("chat", "completions", "responses", "messages"), (35, 15, 25, 25))[0]
        stream = rng.random() < 0.5
        r = rng.random()
        if r < 0.2:
            fate = rng.choice(("drop_before", "drop_mid")) if stream else "drop_before"
        elif r < 0.27 and stream:
            fate = "cancel"
        else:
            fate = "answer"
        feature = "plain"
        if kind != "completions":
            feature = rng.choices(("plain", "tools_auto", "tools_required", "json_schema"), (50, 20, 15, 15))[0]
        out.append(Request(i, kind, stream, fate, feature, long=rng.random() < 0.3,
                           conversation=rng.randrange(conversations) if rng.random() < 0.5 else None,
                           max_tokens=rng.randint(4, max_tokens),
                           chain=kind in ("responses", "chat") and rng.random() < 0.5))
    return out


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation_prefix(conversation: int) -> tuple[str, list[dict]]:
    """A conversation's system prompt and history: the same text each time (prefix hits across requests)."""
    rng = random.Random(1000 + conversation)
    history = []
    for _ in range(rng.randint(1, 3)):
        history += [{"role": "user", "content": words(rng, rng.randint(5, 20))},
                    {"role": "assistant", "content": words(rng, rng.randint(5, 20))}]
    return f"You are helper {conversation}. " + words(rng, rng.randint(10, 30)), history


@dataclass
class Stored:
    """What later requests continue (any of them, so that old ones come back from the host or disk tier; each once
    at most, so that a prompt stays within the context): stored responses' ids, and finished plain chats (the
    request and its reply's text)."""
    responses: list[str] = field(default_factory=list)
    chats: list[tuple[Request, str]] = field(default_factory=list)

    def keep_chat(self, req: Request, out: Outcome, text: str, calls: list) -> None:
        if req.kind == "chat" and req.feature == "plain" and not req.chain and not calls and text and not out.error:
            self.chats.append((req, text))


def body(req: Request, stored: Stored) -> tuple[str, dict]:
    """-> (path, JSON body) of a request."""
    rng = random.Random(req.index)
    question = words(rng, rng.randint(80, 180) if req.long else rng.randint(3, 30))
    system, history = conversation_prefix(req.conversation) if req.conversation is not None else ("", [])
    temperature = rng.choice((0.0, 0.7, 1.0))
    if req.kind == "completions":
        return "/v1/completions", {"model": MODEL_ID, "prompt": f"{system}\n{question}", "stream": req.stream,
                                   "max_tokens": req.max_tokens, "temperature": temperature}
    if req.kind == "messages":
        b = {"model": MODEL_ID, "messages": history + [{"role": "user", "content": question}],
             "max_tokens": req.max_tokens, "stream": req.stream, "temperature": min(temperature, 1.0)}
        if system:
            b["system"] = system
        if req.feature in ("tools_auto", "tools_required"):
            b["tools"] = ANTHROPIC_TOOLS
            b["tool_choice"] = {"type": "auto" if req.feature == "tools_auto" else "any"}
        elif req.feature == "json_schema":
            b["output_format"] = {"type": "json_schema", "schema": SCHEMA}
        return "/v1/messages", b
    messages = ([{"role": "system", "content": system}] if system else []) + history + \
        [{"role": "user", "content": question}]
    if req.kind == "chat":
        if req.chain and stored.chats:         # a conversation coming back, as when the app reopens one
            earlier, reply = rng.choice(stored.chats)
            messages = body(earlier, stored)[1]["messages"] + [{"role": "assistant", "content": reply}, messages[-1]]
        b = {"model": MODEL_ID, "messages": messages, "max_tokens": req.max_tokens, "stream": req.stream,
             "temperature": temperature, "chat_template_kwargs": {"enable_thinking": rng.random() < 0.5}}
        if req.stream:
            b["stream_options"] = {"include_usage": True}
        if req.feature in ("tools_auto", "tools_required"):
            b["tools"] = OPENAI_TOOLS
            b["tool_choice"] = "auto" if req.feature == "tools_auto" else "required"
        elif req.feature == "json_schema":
            b["response_format"] = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
        return "/v1/chat/completions", b
    b = {"model": MODEL_ID, "input": messages[1:] if system else messages, "max_output_tokens": req.max_tokens,
         "stream": req.stream, "temperature": temperature, "reasoning": {"effort": "none"}}
    if system:
        b["instructions"] = system
    if req.chain and stored.responses:
        b["previous_response_id"] = rng.choice(stored.responses)
        b["input"] = question
    if req.feature in ("tools_auto", "tools_required"):
        b["tools"] = RESPONSES_TOOLS
        b["tool_choice"] = "auto" if req.feature == "tools_auto" else "required"
    elif req.feature == "json_schema":
        b["text"] = {"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA}}
    return "/v1/responses", b


# ---- one request ---------------------------------------------------------------------------------------
def send(port: int, path: str, payload: dict, timeout: float) -> tuple[socket.socket, http.client.HTTPResponse]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = json.dumps(payload).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    sock.sendall(head + data)
    return sock, http.client.HTTPResponse(sock)


def reset(sock: socket.socket, response: http.client.HTTPResponse | None = None) -> None:
    """Close with a TCP reset (a client killed, a tab closed): no orderly goodbye."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if response is not None:
        response.close()
    sock.close()


def run(port: int, req: Request, stored: Stored, deadline_s: float, rng: random.Random) -> Outcome:
    out = Outcome(req.index, req.kind, req.stream, req.fate, req.feature)
    path, payload = body(req, stored)
    start = time.monotonic()
    sock = response = None
    try:
        sock, response = send(port, path, payload, deadline_s)
        if req.fate == "drop_before":
            time.sleep(rng.uniform(0, 0.05))
            reset(sock)
            return out
        response.begin()
        out.status = response.status
        if response.status != 200:
            out.error = f"HTTP {response.status}: {response.read()[:200]!r}"
        elif req.stream:
            read_stream(req, sock, response, out, start + deadline_s, rng, stored)
        else:
            check_reply(req, json.loads(response.read()), out, stored)
    except TimeoutError:
        out.hung, out.error = True, f"no answer within {deadline_s} s"
    except (OSError, http.client.HTTPException, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.seconds = time.monotonic() - start
        if response is not None:
            response.close()
        if sock is not None:
            sock.close()
    if out.seconds > deadline_s:
        out.hung = True
    return out


def read_stream(req: Request, sock, response, out: Outcome, deadline: float, rng: random.Random, stored: Stored):
    stop_after = rng.randint(1, 6) if req.fate in ("drop_mid", "cancel") else None
    events, name = [], None
    for raw_line in response:
        if time.monotonic() > deadline:
            out.hung, out.error = True, "the stream went past its deadline"
            return
        line = raw_line.decode().rstrip("\r\n")
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            events.append((name, line[5:].strip()))
            name = None
            if stop_after is not None and len(events) >= stop_after:
                if req.fate == "drop_mid":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                response.close()        # cancel: the SDKs' stream.close(), an orderly close of the connection
                return
    check_stream(req, events, out, stored)


# ---- what a reply must be --------------------------------------------------------------------------------
def valid_json(text: str, schema: dict) -> str:
    """'' when `text` is JSON under `schema`, else why not."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"not JSON under the schema ({type(e).__name__}): {text[:120]!r}"
    return ""


def check_reply(req: Request, reply: dict, out: Outcome, stored: Stored) -> None:
    if req.kind in ("chat", "completions"):
        choice = reply["choices"][0]
        out.finish = choice["finish_reason"]
        text = choice["message"]["content"] or "" if req.kind == "chat" else choice["text"]
        calls = [json.loads(c["function"]["arguments"]) for c in choice.get("message", {}).get("tool_calls") or []]
        done, tools_finish = out.finish == "stop", out.finish == "tool_calls"
    elif req.kind == "messages":
        out.finish = reply["stop_reason"]
        text = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
        calls = [b["input"] for b in reply["content"] if b["type"] == "tool_use"]
        done, tools_finish = out.finish == "end_turn", out.finish == "tool_use"
    else:
        out.finish = reply["status"]
        if out.finish in ("completed", "incomplete") and not req.chain:
            stored.responses.append(reply["id"])
        text = "".join(part["text"] for item in reply["output"] if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")
        calls = [json.loads(item["arguments"]) for item in reply["output"] if item["type"] == "function_call"]
        done, tools_finish = out.finish == "completed" and not calls, out.finish == "completed" and calls
    check_content(req, out, text, calls, done, tools_finish)
    stored.keep_chat(req, out, text, calls)


def check_content(req: Request, out: Outcome, text: str, calls: list[dict], done: bool, tools_finish: bool) -> None:
    """A reply that ended by itself (not at max_tokens) follows its schema, and calls a tool when one is required."""
    if not (done or tools_finish):
        return                          # cut at max_tokens: a schema or a call may be unfinished
    if req.feature == "json_schema" and done:
        out.error = valid_json(text, SCHEMA)
    elif req.feature == "tools_required" and not calls:
        out.error = f"tool_choice required, the reply ({out.finish}) made no call: {text[:80]!r}"
    for args in calls:
        try:
            jsonschema.validate(args, WEATHER)
        except jsonschema.ValidationError as e:
            out.error = f"tool call arguments off their schema: {e.message}"


def check_stream(req: Request, events: list[tuple[str | None, str]], out: Outcome, stored: Stored) -> None:
    if not events:
        out.error = "an empty stream"
        return
    if req.kind in ("chat", "completions"):
        if events[-1][1] != "[DONE]":
            out.error = f"the stream did not end with [DONE]: {events[-1][1][:120]}"
            return
        text, calls = [], {}
        for _, data in events[:-1]:
            chunk = json.loads(data)
            if "error" in chunk:
                out.error = f"an error in the stream: {data[:200]}"
                return
            for choice in chunk["choices"]:
                out.finish = choice.get("finish_reason") or out.finish
                delta = choice.get("delta") or {}
                text.append(delta.get("content") or choice.get("text") or "")
                for call in delta.get("tool_calls") or []:
                    calls[call["index"]] = calls.get(call["index"], "") + (call["function"].get("arguments") or "")
        if not out.finish:
            out.error = "the stream ended without a finish reason"
            return
        calls = [json.loads(a) for a in calls.values()]
        check_content(req, out, "".join(text), calls, out.finish == "stop", out.finish == "tool_calls")
        stored.keep_chat(req, out, "".join(text), calls)
    elif req.kind == "messages":
        names = [n for n, _ in events]
        if "error" in names or names[-1] != "message_stop" or names[0] != "message_start":
            out.error = f"the stream ran {names[0]} .. {names[-1]}: {events[-1][1][:200]}"
            return
        blocks, calls = {}, {}
        for n, data in events:
            ev = json.loads(data)
            if n == "message_delta":
                out.finish = ev["delta"].get("stop_reason") or out.finish
            elif n == "content_block_start" and ev["content_block"]["type"] == "tool_use":
                calls[ev["index"]] = ""
            elif n == "content_block_delta" and ev["delta"]["type"] == "text_delta":
                blocks[ev["index"]] = blocks.get(ev["index"], "") + ev["delta"]["text"]
            elif n == "content_block_delta" and ev["delta"]["type"] == "input_json_delta":
                calls[ev["index"]] += ev["delta"]["partial_json"]
        check_content(req, out, "".join(blocks.values()), [json.loads(a or "{}") for a in calls.values()],
                      out.finish == "end_turn", out.finish == "tool_use")
    else:
        last = json.loads(events[-1][1])
        if last.get("type") not in ("response.completed", "response.incomplete"):
            out.error = f"the stream ended with {last.get('type')}: {events[-1][1][:200]}"
            return
        check_reply(req, last["response"], out, stored)


# ---- the server and what it shows --------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float = 10) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def metrics(port: int) -> dict:
    """The engine's gauges (short names: qwendesk_ stripped), requests by route and status, and the 5xx of the /v1
    routes (/health answers 503 while the model loads, by design)."""
    _, text = get(port, "/metrics")
    values, http = {}, {}
    for line in text.decode().splitlines():
        m = re.fullmatch(r"qwendesk_(\w+)(\{[^}]*\})? (\S+)", line)
        if not m:
            continue
        name, labels, value = m.groups()
        if name == "http_requests_total":
            route, status = re.fullmatch(r'\{route="([^"]*)",status="(\d+)"\}', labels).groups()
            http[f"{route} {status}"] = int(float(value))
        elif labels is None:
            values[name.removeprefix("requests_")] = int(float(value))
    values["http"] = http
    values["server_5xx"] = sum(n for k, n in http.items() if k.startswith("/v1/") and k.split()[1].startswith("5"))
    return values


def start_server(opts: Options, model: str, disk_dir: Path, log_path: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    server = ["tests.random_serve", "--weights", opts.weights] if opts.shape else ["engine.server.cli"]
    cmd = [sys.executable, "-m", *server, "--model", model, "--model-id", MODEL_ID, "--port", str(port),
           "--device", opts.device, "--profile", opts.profile, "--max-context", str(opts.max_context),
           "--host-cache-gb", str(opts.host_cache_gb), "--disk-cache", "--disk-cache-dir", str(disk_dir),
           "--disk-cache-gb", str(opts.disk_cache_gb), "--log-level", "warning"]
    log = open(log_path, "w")
    env = {**os.environ, "QWENDESK_API_KEY": "", "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}        # the server runs the driver's tree
    if opts.server_threads:
        env["OMP_NUM_THREADS"] = str(opts.server_threads)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"qwendesk-serve exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
        try:
            if get(port, "/health", timeout=5)[0] == 200:
                return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"qwendesk-serve did not become ready in {START_TIMEOUT_S} s")
        time.sleep(0.2)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class MemorySampler(threading.Thread):
    """The server's memory while the requests run: (requests done, VmRSS in KiB, its pinned host memory in KiB as
    /metrics last said: torch's pinned allocator's, or the host tier's bytes where that is more) every `every`
    seconds, and its GPU memory allocated (bytes, from /metrics) every `gpu_every` seconds."""

    def __init__(self, pid: int, port: int, done, every: float = 0.25, gpu_every: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.port, self.done, self.every, self.gpu_every = pid, port, done, every, gpu_every
        self.samples: list[tuple[int, int, int]] = []
        self.gpu: list[int] = []
        self.pinned_kb = 0
        self.stop = threading.Event()

    def run(self):
        next_gpu = 0.0
        while not self.stop.is_set():
            self.samples.append((self.done(), rss_kb(self.pid), self.pinned_kb))
            if time.monotonic() >= next_gpu:
                next_gpu = time.monotonic() + self.gpu_every
                try:
                    m = metrics(self.port)
                    self.gpu.append(m.get("gpu_memory_allocated_bytes", 0))
                    self.pinned_kb = max(m.get("host_cache_bytes", 0), m.get("pinned_host_memory_bytes", 0)) // 1024
                except (OSError, http.client.HTTPException):
                    pass                    # a slow /metrics under load: the next sample
            self.stop.wait(self.every)


def rss_report(samples: list[tuple[int, int, int]], warm_after: int, tolerance_mb: float) -> dict:
    """RSS less the pinned host memory (MemorySampler): what would grow with a leak."""
    mb = [(kb - pinned_kb) / 1024 for _, kb, pinned_kb in samples]
    settled = [m for (done, _, _), m in zip(samples, mb) if done > warm_after]     # under load again, past the pause
    settled_at = statistics.median(settled[:max(1, len(settled) // 10)]) if settled else mb[-1]
    last = statistics.median(mb[-max(1, len(mb) // 20):])
    allowed = max(tolerance_mb, 0.1 * settled_at)
    return {"first_mb": round(mb[0], 1), "after_warmup_mb": round(settled_at, 1), "max_mb": round(max(mb), 1),
            "last_mb": round(last, 1), "growth_after_warmup_mb": round(last - settled_at, 1),
            "allowed_growth_mb": round(allowed, 1), "samples": len(mb), "flat": last - settled_at <= allowed}


def gpu_report(before: dict, warmed: dict, samples: list[int], after: dict, tolerance_mb: float) -> dict:
    """GPU memory (torch's allocator, from /metrics), allocated: idle before the run; idle after the warm-up (the
    reference: what is made on first use, such as a speculative round captured for a batch size, is made by then);
    the most seen during the run; idle after it. Reserved (allocated plus the allocator's cache and graph pools)
    before and after."""
    mb = lambda n: round(n / 2**20, 1)      # noqa: E731
    first, settled, last = (m.get("gpu_memory_allocated_bytes", 0) for m in (before, warmed, after))
    return {"before_mb": mb(first), "after_warmup_mb": mb(settled), "max_mb": mb(max([first, last, *samples])),
            "after_mb": mb(last), "growth_after_warmup_mb": mb(last - settled), "allowed_growth_mb": tolerance_mb,
            "reserved_before_mb": mb(before.get("gpu_memory_reserved_bytes", 0)),
            "reserved_after_mb": mb(after.get("gpu_memory_reserved_bytes", 0)), "samples": len(samples),
            "flat": last - settled <= tolerance_mb * 2**20}


def folder_bytes(root: Path) -> tuple[int, int]:
    """(bytes of the .kv files, temporary files) under the disk tier's folder."""
    kv = tmp = 0
    for p in root.rglob("*"):
        if p.name.startswith(".tmp-"):
            tmp += 1
        elif p.suffix == ".kv" and p.is_file():
            kv += p.stat().st_size
    return kv, tmp


def settle(port: int, disk_dir: Path, timeout: float = 60.0) -> tuple[dict, tuple[int, int]]:
    """Wait until nothing runs, waits or holds a page, and the disk tier's folder matches what it counts."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(port)
        on_disk = folder_bytes(disk_dir)
        idle = all(m.get(k, 0) == 0 for k in ("running", "waiting", "kv_pages_used", "state_slots_used"))
        if (idle and on_disk == (m.get("disk_cache_bytes", 0), 0)) or time.monotonic() > deadline:
            return m, on_disk
        time.sleep(0.25)


# ---- the run ------------------------------------------------------------------------------------------
def progress(line: str) -> None:
    """Where the run is, on stderr (the report comes at the end: a run stopped by a time limit says how far it got)."""
    print(f"soak: {line}", file=sys.stderr, flush=True)


def soak(opts: Options) -> dict:
    with tempfile.TemporaryDirectory(prefix="qwendesk-soak-", dir=opts.workdir) as tmp:
        work = Path(tmp)
        model = opts.model
        if opts.shape:
            if model is not None:
                raise ValueError("--shape serves random weights: give it or --model, not both")
            from tests.random_serve import write_model_dir
            model = str(write_model_dir(work / "model", opts.shape))
        elif model is None:
            from tests.fixtures.checkpoints import write_checkpoint
            model = str(write_checkpoint(work / "ckpt", "base"))
        disk_dir, log_path = work / "kv", work / "server.log"
        begun = time.monotonic()
        proc, port = start_server(opts, model, disk_dir, log_path)
        progress(f"the server is up after {time.monotonic() - begun:.0f} s; {opts.requests} requests to send")
        try:
            return drive(opts, proc, port, disk_dir, log_path)
        except OSError:
            if proc.poll() is None:
                raise
            raise RuntimeError(f"qwendesk-serve exited ({proc.returncode}) during the run: "
                               f"{log_path.read_text(errors='replace')[-4000:]}") from None
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def drive(opts: Options, proc: subprocess.Popen, port: int, disk_dir: Path, log_path: Path) -> dict:
    baseline = metrics(port)
    requests = plan(opts.requests, opts.seed, opts.max_tokens, opts.conversations)
    outcomes: list[Outcome] = []
    stored = Stored()
    lock = threading.Lock()
    handed_out = 0

    def send_all(indices: range) -> None:
        """The clients take the requests of `indices` in turn until none is left (or the time limit has passed)."""
        pending = iter(indices)

        def client(k: int):
            nonlocal handed_out
            rng = random.Random(opts.seed * 1000 + indices.start + k)
            while True:
                with lock:
                    late = opts.time_limit_s and time.monotonic() - started > opts.time_limit_s
                    i = None if late else next(pending, None)
                    handed_out += i is not None
                if i is None:
                    return
                outcome = run(port, requests[i], stored, opts.deadline_s, rng)
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(opts.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    sampler = MemorySampler(proc.pid, port, lambda: len(outcomes))
    started = time.monotonic()
    sampler.start()
    warm = int(opts.warmup * len(requests))
    send_all(range(warm))
    warmed, _ = settle(port, disk_dir)      # idle after the warm-up: the reference of the GPU memory
    progress(f"warm-up: {len(outcomes)} requests done, idle after {time.monotonic() - started:.0f} s")
    send_all(range(warm, len(requests)))
    elapsed = time.monotonic() - started
    progress(f"{len(outcomes)} requests done after {elapsed:.0f} s; waiting for the server to settle")
    after, on_disk = settle(port, disk_dir)
    sampler.stop.set()
    sampler.join()
    return report(opts, requests[:handed_out], outcomes, baseline, warmed, after, on_disk, sampler, elapsed,
                  log_path.read_text(errors="replace"))


def report(opts, requests, outcomes, baseline, warmed, after, on_disk, sampler, elapsed, log) -> dict:
    """requests: those handed out (all of them unless the time limit cut the run short). baseline, warmed, after: the
    server's /metrics idle before the requests, after the warm-up's and after all of them."""
    answered = [o for o in outcomes if o.fate == "answer"]
    bad = [o for o in outcomes if o.error and o.fate != "drop_before"]
    client_5xx = [o for o in outcomes if o.status is not None and o.status >= 500]
    tracebacks = log.count("Traceback")
    mix: dict[str, int] = {}
    for r in requests:
        streamed = "streamed" if r.stream else "not streamed"
        for key in (r.kind, streamed, r.fate, r.feature, "long" if r.long else "short"):
            mix[key] = mix.get(key, 0) + 1
    held = {k: after.get(k, 0) for k in ("running", "waiting", "kv_pages_used", "state_slots_used")}
    host_budget, disk_budget = int(opts.host_cache_gb * 2**30), int(opts.disk_cache_gb * 2**30)
    rss = rss_report(sampler.samples, int(opts.warmup * opts.requests), opts.rss_tolerance_mb)
    gpu = gpu_report(baseline, warmed, sampler.gpu, after, opts.gpu_tolerance_mb)
    pinned = {name: round(m.get("pinned_host_memory_bytes", 0) / 2**20, 1)
              for name, m in (("after_warmup_mb", warmed), ("after_mb", after))}
    pinned["allowed_mb"] = round((host_budget + after.get("disk_cache_staging_bytes", 0)) / 2**20 + PINNED_SLACK_MB, 1)
    checks = {
        "no 5xx": not client_5xx and after["server_5xx"] == 0,
        "no hung request": not any(o.hung for o in outcomes),
        "every request accounted for": len(outcomes) == len(requests),
        "answered requests well-formed": not bad,
        "no traceback in the server log": tracebacks == 0,
        "pages and slots back to baseline": all(held[k] == baseline.get(k, 0) for k in held),
        "host tier within its budget": after.get("host_cache_bytes", 0) <= host_budget,
        "disk tier within its budget": after.get("disk_cache_bytes", 0) <= disk_budget,
        "disk folder matches its count, no temporary file": on_disk == (after.get("disk_cache_bytes", 0), 0),
        "RSS flat after warm-up": rss["flat"],
        "GPU memory allocated flat after warm-up": gpu["flat"],
        "pinned host memory within the tiers' bounds": pinned["after_mb"] <= pinned["allowed_mb"],
    }
    seconds = sorted(o.seconds for o in answered) or [0.0]
    return {
        "options": asdict(opts), "elapsed_s": round(elapsed, 1), "requests_per_s": round(len(outcomes) / elapsed, 2),
        "requests_sent": len(requests), "requests_planned": opts.requests,
        "mix": mix, "statuses": {str(s): sum(o.status == s for o in outcomes)
                                 for s in sorted({o.status for o in outcomes}, key=str)},
        "client_5xx": len(client_5xx), "server_5xx": after["server_5xx"], "server_http": after["http"],
        "hung": sum(o.hung for o in outcomes),
        "bad_replies": len(bad), "bad_examples": [asdict(o) for o in bad[:10]], "tracebacks": tracebacks,
        "server_log_tail": log[-4000:] if tracebacks else "",
        "finishes": {f: sum(o.finish == f for o in answered) for f in sorted({o.finish for o in answered})},
        "latency_s": {"p50": round(seconds[len(seconds) // 2], 3), "p99": round(seconds[int(len(seconds) * 0.99)], 3),
                      "max": round(seconds[-1], 3)},
        "baseline": {k: baseline.get(k, 0) for k in GAUGES}, "after": {k: after.get(k, 0) for k in GAUGES},
        "counters": {k: after.get(k, 0) for k in ("prefix_cache_hit_tokens_total", "host_cache_hit_pages_total",
                                                  "host_cache_hit_snapshots_total", "disk_cache_hit_pages_total",
                                                  "disk_cache_hit_snapshots_total", "disk_cache_write_errors_total",
                                                  "disk_cache_rejected_total")},
        "disk_folder_bytes": on_disk[0], "disk_temp_files": on_disk[1], "rss": rss, "gpu": gpu, "pinned": pinned,
        "checks": checks, "passed": all(checks.values()),
    }


def table(r: dict) -> str:
    rss, gpu, a, o = r["rss"], r["gpu"], r["after"], r["options"]
    cut = f" (of {r['requests_planned']} planned: the time limit)" if r["requests_sent"] < r["requests_planned"] else ""
    rows = [
        ("server", f"shape {o['shape']}, {o['weights']} weights, {o['device']}" if o["shape"] else
                   f"{o['model'] or 'the tiny checkpoint'}, {o['device']}"),
        ("requests", f"{sum(r['statuses'].values())}{cut} in {r['elapsed_s']} s ({r['requests_per_s']}/s), "
                     f"{o['clients']} clients, profile {o['profile']}"),
        ("mix", ", ".join(f"{k} {v}" for k, v in r["mix"].items())),
        ("statuses", ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())),
        ("5xx (clients / server)", f"{r['client_5xx']} / {r['server_5xx']}"),
        ("hung", r["hung"]), ("bad replies", r["bad_replies"]), ("server tracebacks", r["tracebacks"]),
        ("finishes", ", ".join(f"{k}: {v}" for k, v in r["finishes"].items())),
        ("latency of answered (s)", f"p50 {r['latency_s']['p50']}, p99 {r['latency_s']['p99']}, "
                                    f"max {r['latency_s']['max']}"),
        ("after: running / waiting", f"{a['running']} / {a['waiting']}"),
        ("after: pages used / cached / total", f"{a['kv_pages_used']} / {a['kv_pages_cached']} / "
                                               f"{a['kv_pages_total']}"),
        ("after: state slots used, snapshots", f"{a['state_slots_used']}, {a['snapshots_cached']}"),
        ("after: host tier", f"{a['host_cache_pages']} pages, {a['host_cache_snapshots']} snapshots, "
                             f"{a['host_cache_bytes']} B"),
        ("after: disk tier", f"{a['disk_cache_pages']} pages, {a['disk_cache_snapshots']} snapshots, "
                             f"{a['disk_cache_bytes']} B (folder {r['disk_folder_bytes']} B, "
                             f"{r['disk_temp_files']} temp files)"),
        ("prefix hits: tokens / host pages, snapshots / disk pages, snapshots",
         "{} / {}, {} / {}, {}".format(*list(r["counters"].values())[:5])),
        ("pinned host memory MB idle: after warm-up / after",
         f"{r['pinned']['after_warmup_mb']} / {r['pinned']['after_mb']} (allowed {r['pinned']['allowed_mb']}: the "
         f"host tier's budget, the disk tier's staging, {PINNED_SLACK_MB} more)"),
        ("RSS less pinned memory, MB: first / after warm-up / max / last",
         f"{rss['first_mb']} / {rss['after_warmup_mb']} / {rss['max_mb']} / {rss['last_mb']} "
         f"(growth {rss['growth_after_warmup_mb']}, allowed {rss['allowed_growth_mb']})"),
        ("GPU allocated MB idle: before / after warm-up / (max) / after",
         f"{gpu['before_mb']} / {gpu['after_warmup_mb']} / ({gpu['max_mb']}) / {gpu['after_mb']} (growth "
         f"{gpu['growth_after_warmup_mb']}, allowed {gpu['allowed_growth_mb']}; reserved "
         f"{gpu['reserved_before_mb']} -> {gpu['reserved_after_mb']})"),
    ]
    rows += [(f"check: {name}", "ok" if ok else "FAILED") for name, ok in r["checks"].items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"| {k:<{width}} | {v} |" for k, v in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    defaults = Options()
    for name, value in asdict(defaults).items():
        kind = type(value) if value is not None else str
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=value)
    ap.add_argument("--json", help="write the report here")
    args = vars(ap.parse_args(argv))
    out = args.pop("json")
    from engine.bench.random_model import SHAPES
    if args["shape"] not in (None, "tiny", *SHAPES):
        ap.error(f"--shape: one of tiny, {', '.join(SHAPES)}")
    for name in ("requests", "clients", "conversations"):
        if args[name] < 1:
            ap.error(f"--{name}: at least 1")
    if args["weights"] not in ("int4", "bf16"):
        ap.error("--weights: int4 or bf16")
    if args["shape"] and args["model"]:
        ap.error("--shape serves random weights: give it or --model, not both")
    result = soak(Options(**args))
    print(table(result))
    if result["server_log_tail"]:
        print("the server's log ends:\n" + result["server_log_tail"])
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
