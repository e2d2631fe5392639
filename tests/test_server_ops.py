"""Operations and safety of the HTTP server: health while loading, metrics, API keys, Host checks,
CORS, body limits, a full queue (429 / 529), disconnects freeing pages, engine failures in-stream,
and the qwendesk-serve command."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

import anthropic
import openai
import pytest

from engine.server import ServerSettings, ServerThread, create_app
from tests.server_harness import MODEL, Steering, make_engine, raw, serving, sse_events, wait_idle

USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def engine(checkpoint):
    e = make_engine(checkpoint("base"), profile="C1", max_queue=1, max_context=512)
    yield e
    e.close()


@pytest.fixture(scope="module")
def steer(engine):
    return Steering(engine.tokenizer)


@pytest.fixture(autouse=True)
def reset(steer, engine):
    steer.reset()
    yield
    steer.reset()
    wait_idle(engine)


@pytest.fixture(scope="module")
def server(engine, steer):
    with serving(engine, steer) as s:
        yield s


def chat_body(**kw):
    return {"model": MODEL, "messages": USER, "max_tokens": 8, **kw}


def open_stream(server, path="/v1/chat/completions", body=None):
    """Start a streamed request and read its headers; returns (connection, response)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", path, body=json.dumps(body or chat_body(stream=True, max_tokens=400)),
                 headers={"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_health_is_503_while_loading_then_200(engine):
    app = create_app(ServerSettings(model_id=MODEL))
    srv = ServerThread(app, port=0).start()
    try:
        status, _, body = raw(srv, "GET", "/health")
        assert status == 503 and json.loads(body)["status"] == "loading"
        status, _, body = raw(srv, "POST", "/v1/chat/completions", chat_body())
        assert status == 503 and json.loads(body)["error"]["type"] == "server_error"
        app.state.server.set_engine(engine)
        status, _, body = raw(srv, "GET", "/health")
        assert status == 200 and json.loads(body) == {"status": "ok", "model": MODEL}
    finally:
        srv.stop()


def test_metrics(server, steer):
    steer.say("Hi.</think>\n\nHello!")
    assert raw(server, "POST", "/v1/chat/completions", chat_body(max_tokens=40))[0] == 200
    raw(server, "POST", "/v1/chat/completions", {"model": "nope", "messages": USER})
    status, headers, body = raw(server, "GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for line in ('qwendesk_http_requests_total{route="/v1/chat/completions",status="200"}',
                 'qwendesk_http_requests_total{route="/v1/chat/completions",status="404"}',
                 'qwendesk_generations_total{reason="stop"}', "qwendesk_prompt_tokens_total ",
                 "qwendesk_completion_tokens_total ", 'qwendesk_time_to_first_token_seconds_bucket{le="+Inf"}',
                 "qwendesk_request_latency_seconds_count ", "qwendesk_requests_waiting 0",
                 "qwendesk_requests_running ", "qwendesk_kv_pages_used ", "qwendesk_prefix_cache_hit_tokens_total ",
                 "qwendesk_gpu_memory_allocated_bytes 0", "qwendesk_ready 1"):     # 0: a CPU engine
        assert line in text, line


def test_api_key(engine, steer):
    with serving(engine, steer, api_key="sekret") as srv:
        steer.say("ok")
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.code == "invalid_api_key"
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert good.models.list().data[0].id == MODEL
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
                model=MODEL, max_tokens=5, messages=USER)
        assert e.value.body["error"]["type"] == "authentication_error"
        m = anthropic.Anthropic(base_url=srv.url, api_key="sekret", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=USER)
        assert m.content[0].text == "ok"
        assert raw(srv, "GET", "/health")[0] == 200                  # probes need no key
        assert raw(srv, "GET", "/metrics")[0] == 401
        assert raw(srv, "GET", "/metrics", headers={"authorization": "Bearer sekret"})[0] == 200


def test_foreign_host_is_refused(engine, server):
    status, _, body = raw(server, "GET", "/v1/models", headers={"host": "evil.example:8080"})
    assert status == 403 and json.loads(body)["error"]["code"] == "host_not_allowed"
    status, _, body = raw(server, "POST", "/v1/messages", {}, headers={"host": "attacker.test"})
    assert status == 403 and json.loads(body)["error"]["type"] == "permission_error"
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}", "192.168.1.5:80",
                 "[fd00::5]:8080"):                               # a literal address cannot be rebound
        assert raw(server, "GET", "/v1/models", headers={"host": host})[0] == 200
    with serving(engine, allowed_hosts=["qwen.lan"]) as srv:
        assert raw(srv, "GET", "/v1/models", headers={"host": "qwen.lan:1234"})[0] == 200
        assert raw(srv, "GET", "/v1/models", headers={"host": "other.lan"})[0] == 403


def test_cors_is_off_unless_origins_are_listed(engine, server):
    preflight = {"origin": "http://app.local", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type"}
    _, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in headers
    with serving(engine, cors_origins=["http://app.local"]) as srv:
        status, headers, _ = raw(srv, "OPTIONS", "/v1/chat/completions", headers=preflight)
        assert status == 200 and headers["access-control-allow-origin"] == "http://app.local"


def test_body_size_limit(engine):
    with serving(engine, max_body_bytes=2000) as srv:
        big = chat_body(messages=[{"role": "user", "content": "x" * 5000}])
        status, _, body = raw(srv, "POST", "/v1/chat/completions", big)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        status, _, body = raw(srv, "POST", "/v1/messages", big)
        assert status == 413 and json.loads(body)["error"]["type"] == "request_too_large"
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)    # no Content-Length
        conn.request("POST", "/v1/chat/completions", body=iter([json.dumps(big).encode()]),
                     headers={"content-type": "application/json"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == "request_too_large"
        conn.close()


def test_full_queue_is_429_and_529_and_queued_streams_finish(engine, steer, server):
    steer.endless(delay=0.005)
    conn_a, _ = open_stream(server)                            # runs (profile C1)
    wait_for(lambda: engine.stats()["running"] == 1)
    conn_b, resp_b = open_stream(server, body=chat_body(stream=True, max_tokens=5))   # waits in the queue
    wait_for(lambda: engine.stats()["waiting"] == 1)
    with pytest.raises(openai.RateLimitError) as e:
        openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, messages=USER, max_tokens=5)
    assert e.value.code == "server_overloaded" and e.value.response.headers["retry-after"]
    with pytest.raises(anthropic.APIStatusError) as e:
        anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=USER)
    assert e.value.status_code == 529 and e.value.body["error"]["type"] == "overloaded_error"
    conn_a.close()                                              # A disconnects: B gets its turn
    events = [data for _, data in sse_events(resp_b.read())]
    conn_b.close()
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    stats = wait_idle(engine)
    assert stats["kv_pages_used"] == 0 and stats["running"] == 0


def test_disconnect_cancels_and_frees_pages(engine, steer, server):
    steer.endless(delay=0.005)
    before = engine.stats()["kv_pages_used"]
    for path, body in (("/v1/chat/completions", chat_body(stream=True, max_tokens=400)),
                       ("/v1/messages", {"model": MODEL, "max_tokens": 400, "messages": USER, "stream": True}),
                       ("/v1/responses", {"model": MODEL, "max_output_tokens": 400, "input": "Hi", "stream": True})):
        conn, resp = open_stream(server, path, body)
        resp.read1(100)
        wait_for(lambda: engine.stats()["kv_pages_used"] > before)
        conn.close()
        t0 = time.monotonic()
        stats = wait_idle(engine, timeout=5)
        assert stats["kv_pages_used"] == before and stats["running"] == 0, stats
        assert time.monotonic() - t0 < 2
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)  # not streamed: same
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat_body(max_tokens=400)),
                 headers={"content-type": "application/json"})
    wait_for(lambda: engine.stats()["running"] == 1)
    conn.close()
    assert wait_idle(engine, timeout=5)["running"] == 0
    text = raw(server, "GET", "/metrics")[2].decode()
    assert 'qwendesk_generations_total{reason="cancelled"}' in text
    # the client left: counted as 499 (client closed request), not as a 503 of the server's
    wait_for(lambda: 'route="/v1/chat/completions",status="499"} 1' in raw(server, "GET", "/metrics")[2].decode())
    assert 'status="503"' not in raw(server, "GET", "/metrics")[2].decode()


def test_keepalive_while_nothing_is_generated(engine, steer):
    steer.endless(delay=0.15)
    with serving(engine, steer, keepalive_s=0.05) as srv:
        _, _, body = raw(srv, "POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=2))
        assert b"\n: keep-alive\n" in body and sse_events(body)[-1][1] == "[DONE]"
        _, _, body = raw(srv, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": USER,
                                                       "stream": True})
        names = [name for name, _ in sse_events(body)]
        assert names.count("ping") > 1 and names[-1] == "message_stop"


def test_engine_failure_ends_streams_with_an_error(server, steer):
    steer.failing = True
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="generation failed"):
        list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5, stream=True))
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5)
    assert e.value.body["type"] == "server_error"
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="generation failed"):
        list(a.messages.create(model=MODEL, max_tokens=5, messages=USER, stream=True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_qwendesk_serve_command(checkpoint, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.server.cli", "--model", str(checkpoint("base")),
                             "--port", str(port), "--device", "cpu", "--max-context", "256", "--model-id", "tiny",
                             "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        deadline = time.monotonic() + 90
        while True:
            try:
                if client.models.list().data[0].id == "tiny":
                    break
            except (openai.APIConnectionError, openai.InternalServerError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
                time.sleep(0.2)
        r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=3)
        assert r.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    (tmp_path / "config.json").write_bytes((checkpoint("base") / "config.json").read_bytes())  # no weights
    bad = subprocess.run([sys.executable, "-m", "engine.server.cli", "--model", str(tmp_path), "--port",
                          str(free_port()), "--device", "cpu"], capture_output=True, text=True, timeout=90,
                         env={**os.environ, "QWENDESK_API_KEY": ""})
    assert bad.returncode == 1 and "cannot load" in bad.stderr


def test_usage_reports_speculation():
    """A request that speculated: its kept and thrown-away drafts are OpenAI's accepted / rejected prediction
    tokens, with rounds, how they were drafted and per-position rates beside them (Anthropic: the same block)."""
    from engine.api import SpeculationStats, Usage
    from engine.server.anthropic import routes as anthropic_routes
    from engine.server.openai import routes as openai_routes
    spec = SpeculationStats(method="dflash")
    spec.add(3, 2)
    spec.add(3, 0)
    usage = Usage(prompt_tokens=10, completion_tokens=4, speculation=spec)
    body = openai_routes.usage_json(usage)
    assert body["completion_tokens_details"]["accepted_prediction_tokens"] == 2
    assert body["completion_tokens_details"]["rejected_prediction_tokens"] == 4
    assert body["speculation"] == {"rounds": 2, "drafted_tokens": 6, "accepted_tokens": 2, "method": "dflash",
                                   "tokens_per_round": 2.0, "position_rates": [0.5, 0.5, 0.0]}
    assert anthropic_routes.usage_json(usage)["speculation"] == body["speculation"]
    assert "speculation" not in openai_routes.usage_json(Usage(prompt_tokens=1))


def metric(server, name: str) -> int:
    for line in raw(server, "GET", "/metrics")[2].decode().splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"{name} not in /metrics")


def test_request_outcomes_add_up_and_cached_tokens_agree(engine, steer, server):
    """completed + failed + abandoned + dropped = started; an abandoned request is a 499, not a 5xx; the
    cached-token counter counts dropped streams too, so it equals the engine's prefix hits."""
    outcome = lambda o: metric(server, f'qwendesk_generation_requests_total{{outcome="{o}"}}')   # noqa: E731
    before = {o: outcome(o) for o in ("completed", "failed", "abandoned", "dropped")}
    started = metric(server, "qwendesk_generation_requests_started_total")
    steer.say("Hi.</think>\n\nHello!")
    long = [{"role": "user", "content": "Tell me about the sea. " * 20}]     # pages and a snapshot to keep
    assert raw(server, "POST", "/v1/chat/completions", chat_body(messages=long, max_tokens=40))[0] == 200
    steer.reset()
    steer.endless(delay=0.005)
    for path, body in (("/v1/chat/completions", chat_body(stream=True, max_tokens=400)),     # dropped midway
                       ("/v1/messages", {"model": MODEL, "max_tokens": 400, "messages": USER, "stream": True})):
        conn, resp = open_stream(server, path, body)
        resp.read1(100)
        wait_for(lambda: engine.stats()["running"] == 1)
        conn.close()
        wait_for(lambda: engine.stats()["running"] == 0)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)    # abandoned before the reply
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat_body(max_tokens=400)),
                 headers={"content-type": "application/json"})
    wait_for(lambda: engine.stats()["running"] == 1)
    conn.close()
    wait_for(lambda: engine.stats()["running"] == 0)
    steer.reset()
    steer.failing = True
    assert raw(server, "POST", "/v1/chat/completions", chat_body())[0] == 500               # failed
    wait_for(lambda: outcome("abandoned") == before["abandoned"] + 1 and outcome("dropped") == before["dropped"] + 2)
    after = {o: outcome(o) for o in before}
    assert {o: after[o] - before[o] for o in after} == {"completed": 1, "failed": 1, "abandoned": 1, "dropped": 2}
    assert metric(server, "qwendesk_generation_requests_started_total") - started == 5
    text = raw(server, "GET", "/metrics")[2].decode()
    assert 'route="/v1/chat/completions",status="499"' in text and 'status="503"' not in text
    assert metric(server, "qwendesk_cached_tokens_total") == metric(server, "qwendesk_prefix_cache_hit_tokens_total")
    stats = engine.stats()
    assert metric(server, "qwendesk_state_slots_used") == stats["state_slots_used"] == 0
    assert metric(server, "qwendesk_snapshots_cached") == stats["snapshots_cached"] > 0


def test_tokens_that_come_while_a_stream_waits_go_out_merged(engine, steer):
    """stream_interval_s: what the engine wrote meanwhile goes out as one chunk, the same text in fewer chunks."""
    text = "one two three four five six seven eight nine ten eleven twelve"
    steer.say("Hm.</think>\n\n" + text)
    with serving(engine, steer, stream_interval_s=0.2) as srv:
        _, _, body = raw(srv, "POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=60))
    deltas = [json.loads(d)["choices"][0]["delta"] for _, d in sse_events(body)[:-1] if json.loads(d)["choices"]]
    content = [d["content"] for d in deltas if d.get("content")]
    assert "".join(content) == text
    assert len(content) < len(steer.tok.encode(text)) // 2


def test_a_late_wake_up_for_events_already_read_sends_no_keepalive():
    """The waker can set a generation's wake after the stream has read the events it was for (they came while it
    was converting the batch before): the stream waits on, and only its keep-alive deadline sends a ping."""
    import asyncio

    from engine.api import SamplingParams, StreamEvent, Text
    from engine.server.bridge.generation import Generation, Wakeups
    from engine.server.bridge.prompting import Prompt

    class Handle:
        def __init__(self):
            self.events = []

        def ready(self):
            out, self.events = self.events, []
            return out

        def cancel(self):
            pass

    class Engine:
        def submit(self, ids, params, **kw):
            self.handle = Handle()
            return self.handle

    async def stream() -> list:
        engine = Engine()
        gen = Generation(engine, Prompt([1], SamplingParams(), None), Wakeups(asyncio.get_running_loop()),
                         keepalive_s=0.3)
        loop, out = asyncio.get_running_loop(), []
        engine.handle.events = [StreamEvent("delta", [Text("a")])]
        loop.call_later(0.05, gen.wake.set)                  # late: "a" was read before it comes
        loop.call_later(0.1, lambda: engine.handle.events.append(StreamEvent("delta", [Text("b")])))
        loop.call_later(0.15, gen.wake.set)
        loop.call_later(0.6, lambda: engine.handle.events.append(StreamEvent("finish", finish_reason="stop")))
        loop.call_later(0.65, gen.wake.set)
        async for ev in gen.events():
            out.append(type(ev).__name__ if not isinstance(ev, Text) else ev.text)
        return out

    out = asyncio.run(stream())
    assert out[:2] == ["a", "b"] and out.count("Keepalive") == 1 and out[-1] == "Finish", out
