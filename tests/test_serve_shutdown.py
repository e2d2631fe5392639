"""qwendesk-serve stopped with Ctrl-C while it streams: each open stream ends as its protocol ends (OpenAI: an
error chunk, then `data: [DONE]`; the Responses API: `response.failed`; Anthropic: an `error` event), and
the process exits at once, cleanly."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tests.server_harness import sse_events

USER = [{"role": "user", "content": "Hello"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stream(threading.Thread):
    """A streamed request, read to its end in the background (the server never waits on a full socket)."""

    def __init__(self, port: int, path: str, body: dict):
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        self.lines: list[bytes] = []
        self.start()

    def run(self):
        for line in self.resp:
            self.lines.append(line)

    def data_events(self) -> int:
        return sum(line.startswith(b"data:") for line in self.lines)

    def events(self) -> list[tuple[str | None, str]]:
        return sse_events(b"".join(self.lines))


def wait_until(predicate, proc, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def test_ctrl_c_ends_open_streams_and_exits_at_once(checkpoint):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.server.cli", "--model", str(checkpoint("base")),
                             "--port", str(port), "--device", "cpu", "--profile", "C1", "--model-id", "tiny",
                             "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "QWENDESK_API_KEY": ""})
    try:
        wait_until(lambda: ready(port), proc)
        # profile C1: the OpenAI stream generates (it ignores the stop token, so it runs until stopped), the
        # Anthropic one waits in the queue behind it (its first events sent, no token yet)
        openai = Stream(port, "/v1/chat/completions", {"model": "tiny", "messages": USER, "stream": True,
                                                       "max_tokens": 3000, "ignore_eos": True})
        wait_until(lambda: openai.data_events() >= 3, proc)
        anthropic = Stream(port, "/v1/messages", {"model": "tiny", "messages": USER, "stream": True,
                                                  "max_tokens": 3000})
        wait_until(lambda: anthropic.data_events() >= 2, proc)          # message_start, ping
        responses = Stream(port, "/v1/responses", {"model": "tiny", "input": "Hello", "stream": True,
                                                   "max_output_tokens": 3000})
        wait_until(lambda: responses.data_events() >= 2, proc)          # response.created, .in_progress
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert took < 2.0, f"took {took:.1f} s to exit"
    assert "Traceback" not in err, err
    openai.join(5)
    anthropic.join(5)
    responses.join(5)
    *_, (_, error), (_, done) = openai.events()
    assert done == "[DONE]"
    assert json.loads(error)["error"]["message"] == "the request was cancelled: the server is shutting down"
    name, data = anthropic.events()[-1]
    assert name == "error"
    assert json.loads(data)["error"]["message"] == "the request was cancelled: the server is shutting down"
    name, data = responses.events()[-1]
    assert name == "response.failed"
    assert json.loads(data)["response"]["error"]["message"] == "the request was cancelled: the server is shutting down"
