"""Connection limits (engine/server/http/connections.py): what a client that never sends a key can hold. Raw sockets: a
slow client is one that sends its headers a byte at a time, or never finishes them."""

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.server import ServerSettings, ServerThread, create_app


@pytest.fixture
def limited():
    """A server (no engine: /health answers 503, which is all these tests need) with small limits."""
    settings = ServerSettings(api_key="secret", header_timeout_s=1.0, max_connections_per_client=8,
                              max_header_bytes=8 * 1024, idle_timeout_s=1.0, body_timeout_s=1.0)
    server = ServerThread(create_app(settings), port=0).start()
    yield server
    server.stop()


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def answer(sock) -> tuple[int | None, bytes, float]:
    """(status, body, seconds until the server closed the connection); status None: closed without a word."""
    start, data = time.monotonic(), b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    elapsed = time.monotonic() - start
    sock.close()
    if not data:
        return None, b"", elapsed
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body, elapsed


def one_response(sock) -> bytes:
    """One whole response of a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def health(server) -> int:
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    return answer(sock)[0]


def test_headers_that_never_finish_are_closed_with_408(limited):
    silent, partial, trickle = connect(limited), connect(limited), connect(limited)
    partial.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    start = time.monotonic()
    for byte in b"X-Slow:":        # a byte every 0.1 s: data keeps coming, the headers never end
        trickle.sendall(bytes([byte]))
        time.sleep(0.1)
    for sock in (silent, partial, trickle):
        status, body, _ = answer(sock)
        assert status == 408 and "1 s" in json.loads(body)["error"]["message"]
    assert time.monotonic() - start < 5
    assert health(limited) == 503                 # (no engine) the server itself is fine


def test_a_kept_alive_connection_gets_the_same_time_for_its_next_request(limited):
    sock = connect(limited)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert one_response(sock).startswith(b"HTTP/1.1 503")
    sock.sendall(b"GET /health HTTP/1.1\r\n")                # the next request's headers never finish
    status, _, elapsed = answer(sock)
    assert status == 408 and elapsed < 3


def test_an_idle_kept_alive_connection_is_closed(limited):
    sock = connect(limited)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert one_response(sock).startswith(b"HTTP/1.1 503")
    status, _, elapsed = answer(sock)
    assert status is None and elapsed < 3


def test_headers_over_the_limit_are_431(limited):
    sock = connect(limited)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 20_000)
    status, body, _ = answer(sock)
    assert status == 431 and "8192 bytes" in json.loads(body)["error"]["message"]
    sock = connect(limited)                        # a body of any size after small headers is not counted
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 30000\r\nConnection: close\r\n\r\n" + b" " * 30_000)
    assert answer(sock)[0] == 401                 # the key is checked: the headers were read


def test_a_body_that_stops_arriving_is_cut_and_a_slow_steady_one_is_not(limited, caplog):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"x-api-key: secret\r\nContent-Length: 15\r\nConnection: close\r\n\r\n")
    stalled = connect(limited)
    stalled.sendall(head + b'{"mod')
    status, body, elapsed = answer(stalled)
    assert status == 408 and "body" in json.loads(body)["error"]["message"] and elapsed < 3
    time.sleep(0.2)
    assert not [r for r in caplog.records if r.exc_info], "a traceback for a client that stalled"
    steady = connect(limited)
    steady.sendall(head)
    for piece in (b'{"mod', b'el": ', b'"x"}\n'):        # a piece every 0.6 s: 1.8 s in all, never 1 s apart
        time.sleep(0.6)
        steady.sendall(piece)
    assert answer(steady)[0] == 400             # read whole, then validated (it has no messages)


def test_one_client_cannot_hold_more_than_its_share(limited):
    held = [connect(limited) for _ in range(8)]
    time.sleep(0.2)
    extra = [connect(limited) for _ in range(5)]
    for sock in extra:
        status, body, elapsed = answer(sock)
        assert status == 503 and "too many open connections" in json.loads(body)["error"]["message"]
        assert elapsed < 1
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 5
    while health(limited) != 503 and time.monotonic() < deadline:
        time.sleep(0.05)


SLOW_SERVER = textwrap.dedent("""
    import logging, resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    logging.basicConfig(level="INFO", stream=sys.stderr)
    from engine.server import ServerSettings, ServerThread, create_app
    server = ServerThread(create_app(ServerSettings(header_timeout_s=2.0)), port=0, log_level="info").start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()
""")


@pytest.mark.skipif(sys.platform == "win32", reason="lowers RLIMIT_NOFILE (POSIX)")
def test_ten_thousand_slow_sockets_from_one_client(tmp_path):
    """The server's file limit lowered to 256 (its cap then 128 connections): 10,000 sockets that each send part of
    their headers. None gets a traceback into the log, the log says so in a few lines, and /health answers at once
    after they are gone."""
    with open(tmp_path / "log", "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log_file, text=True)
    try:
        port = int(proc.stdout.readline())
        start = time.monotonic()
        socks, fds = [], []
        for i in range(10_000):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: loc")
                socks.append(sock)
            except OSError:     # the server has closed it already
                pass
            if i % 10 == 0:     # (let the server's process run: the kernel drops a SYN while its backlog is full,
                time.sleep(0.002)   # and this process would then wait a second for the retry)
            if i % 100 == 0:
                fds.append(len(list(Path(f"/proc/{proc.pid}/fd").iterdir())))
        print("server fds", max(fds), "time", time.monotonic() - start)
        assert max(fds) < 256
        for sock in socks:
            sock.close()
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 503")      # (no engine) it answers
        assert time.monotonic() - start < 1
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)
    log = (tmp_path / "log").read_text()
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "connections" in line or "descriptor" in line]) <= 10, log


def test_bad_requests_are_answered_without_a_log_line_each(limited, caplog):
    caplog.set_level("INFO")
    upgrade = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    for request in (b"GARBAGE\r\n\r\n", upgrade) * 25:
        sock = connect(limited)
        sock.sendall(request)
        sock.settimeout(5)
        assert sock.recv(100).startswith(b"HTTP/1.1 ")      # answered (400, or the route's answer)
        sock.close()
    lines = [r for r in caplog.records if r.name.startswith(("uvicorn", "qwendesk"))]
    assert len(lines) <= 3, [r.getMessage() for r in lines]
