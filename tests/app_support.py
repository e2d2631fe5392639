"""Support for the app tests: a context over temporary folders, screenshots, and loopback fakes
of the Hugging Face hub and of an OpenAI-compatible server."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def prepare_app_env(tmp_path: Path, monkeypatch, qapp) -> Path:
    """Each test module's `app_env` fixture: the app's data folder in tmp_path, the theme
    applied, and a tiny thinking budget for "low" effort (short replies)."""
    from app import settings as app_settings
    from app.theme import apply_theme

    monkeypatch.setenv("QWENDESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setitem(app_settings.THINKING_BUDGETS, "low", 6)
    apply_theme(qapp, "dark")
    return tmp_path


def seeded_replies(monkeypatch, seed: int = 3, **overrides) -> None:
    """Replies from the tiny random model that do not depend on luck: a fixed seed, no early end
    of sequence, and any other SamplingParams fields given."""
    from app.settings import AppSettings

    usual = AppSettings.sampling_params

    def seeded(self, thinking):
        params = usual(self, thinking)
        params.seed, params.ignore_eos = seed, True
        for key, value in overrides.items():
            setattr(params, key, value)
        return params

    monkeypatch.setattr(AppSettings, "sampling_params", seeded)


def make_context(tmp_path: Path, device=None, hub_endpoint: str | None = None, **settings):
    """An AppContext over tmp_path (database, models folder, empty HF cache); `device`: a simulated one
    (engine.api.DeviceInfo), else this machine's."""
    from app.catalog import load_catalog
    from app.context import AppContext
    from app.settings import AppSettings
    from app.store import Store
    from engine.api import probe

    store = Store(tmp_path / "data" / "qwendesk.sqlite3")
    saved = AppSettings.load(store)
    return AppContext(store=store, settings=saved.copy(**settings), models_dir=tmp_path / "data" / "models",
                      device=device or probe(),
                      hf_cache_dir=tmp_path / "hf-cache", hub_endpoint=hub_endpoint, catalog=load_catalog())


def page_screenshot(page, name: str) -> Path:
    """The whole of a scrolling page, not just what the window shows."""
    from PySide6.QtWidgets import QScrollArea

    return screenshot(page.findChild(QScrollArea).widget(), name)


def screenshot(widget, name: str) -> Path:
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()            # pending layout requests (labels whose text just changed)
    QApplication.processEvents()
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert widget.grab().save(str(path)), f"could not write {path}"
    return path

COMMIT = "5f0c0ffee" + "0" * 31


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 with a random port, run on a daemon thread."""

    def __init__(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeHub(_Server):
    """Answers the routes the app's downloader uses:
    GET /api/models/{repo}[/revision/{rev}]  model info with per-file size, blob id and LFS sha256
    GET|HEAD /{repo}/resolve/{rev}/{path}     file bytes with Range support, ETag and size headers
    GET /api/models?search=&sort=downloads&limit=  the model search: the repos whose id holds `search`
                                              (case-insensitive), most downloaded first, in the hub's JSON shape.
    Knobs: `corrupt_once` (paths served with a flipped byte the first time), `cut_after`
    (path -> bytes sent before the connection drops, once), `delay` (seconds per 4 KiB sent)."""

    def __init__(self, repos: dict[str, Path], downloads: dict[str, int] | None = None):
        self.repos = {repo: {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
                      for repo, d in repos.items()}
        self.downloads = downloads or {}         # repo -> its download count (the search's order)
        self.corrupt_once: set[str] = set()
        self.cut_after: dict[str, int] = {}
        self.delay = 0.0
        self.requests: list[tuple[str, str, str | None]] = []    # method, path, Range header
        super().__init__(_HubHandler)

    def file_gets(self, name: str) -> list[str | None]:
        """The Range headers of the GETs of a file, in order."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + name)]

    def info(self, repo: str) -> dict:
        siblings = []
        for path, data in self.repos[repo].items():
            entry = {"rfilename": path, "size": len(data), "blobId": git_blob_sha1(data)}
            if path.endswith(".safetensors"):
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        return {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings}

    def search(self, query: str, limit: int) -> list[dict]:
        """/api/models' answer: one entry per repository, the fields the hub sends without `full`."""
        found = sorted((r for r in self.repos if query.lower() in r.lower()), key=lambda r: -self.downloads.get(r, 0))
        return [{"_id": hashlib.sha1(r.encode()).hexdigest()[:24], "id": r, "modelId": r, "likes": 0,
                 "downloads": self.downloads.get(r, 0), "private": False, "tags": ["safetensors"],
                 "pipeline_tag": "text-generation", "library_name": "transformers",
                 "createdAt": "2026-11-01T00:00:00.000Z"} for r in found[:limit]]


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool):
        hub: FakeHub = self.server.owner
        path = self.path.split("?")[0]
        hub.requests.append((self.command, path, self.headers.get("Range")))
        if path == "/api/models":
            query = parse_qs(urlsplit(self.path).query)
            found = hub.search(query.get("search", [""])[0], int(query.get("limit", ["1000"])[0]))
            return self._send(200, json.dumps(found).encode(), {"Content-Type": "application/json"})
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m and m.group(1) in hub.repos:
            return self._send(200, json.dumps(hub.info(m.group(1))).encode(), {"Content-Type": "application/json"})
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m or m.group(1) not in hub.repos or m.group(3) not in hub.repos[m.group(1)]:
            return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        name, data = m.group(3), hub.repos[m.group(1)][m.group(3)]
        headers = {"ETag": f'"{git_blob_sha1(data)}"', "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes"}
        if not head and name in hub.corrupt_once:
            hub.corrupt_once.discard(name)
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if head:
            return self._send(200, b"", {**headers, "Content-Length": str(len(data))}, length_only=True)
        cut = hub.cut_after.pop(name, None)
        self._send(206 if rng else 200, body, headers, cut=cut, delay=hub.delay)

    def _send(self, status, body, headers, cut=None, delay=0.0, length_only=False):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if not length_only:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if length_only:
            return
        sent = 0
        try:
            while sent < len(body):
                piece = body[sent:sent + 4096]
                if cut is not None and sent + len(piece) > cut:
                    self.wfile.write(body[sent:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(piece)
                sent += len(piece)
                if delay:
                    self.wfile.flush()
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FakeOpenAI(_Server):
    """/v1/models and a streaming /v1/chat/completions that thinks, answers and reports usage.
    `requests` keeps each chat request's JSON body; `api_key` is checked when set."""

    def __init__(self, api_key: str = "", words: int = 6, delay: float = 0.0):
        self.api_key, self.words, self.delay = api_key, words, delay
        self.requests: list[dict] = []
        super().__init__(_OpenAIHandler)


class _OpenAIHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _authorized(self) -> bool:
        fake: FakeOpenAI = self.server.owner
        if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
            body = b'{"error": {"message": "invalid api key"}}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return False
        return True

    def do_GET(self):
        if not self._authorized():
            return
        body = json.dumps({"object": "list", "data": [{"id": "big-qwen", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        fake: FakeOpenAI = self.server.owner
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._authorized():
            return
        fake.requests.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        deltas = [{"reasoning_content": "Let me think. "}]
        deltas += [{"content": f"word{i} "} for i in range(fake.words)]
        try:
            for d in deltas:
                self._event({"choices": [{"index": 0, "delta": d, "finish_reason": None}]})
                time.sleep(fake.delay)
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            self._event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": fake.words + 3,
                                                  "prompt_tokens_details": {"cached_tokens": 4}}})
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def _event(self, payload: dict):
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


def open_window(qtbot, context, autoload: bool = True):
    """A shown MainWindow; closing it at the end of the test shuts it down."""
    from app.window import MainWindow

    window = MainWindow(context, autoload=autoload)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def wait_ready(qtbot, window, timeout: int = 30_000) -> None:
    qtbot.waitUntil(lambda: window.engine.model is not None and window.session.backend is window.engine,
                    timeout=timeout)


def send(qtbot, window, text: str) -> None:
    from PySide6.QtCore import Qt

    composer = window.chat.composer
    composer.input.setPlainText(text)
    qtbot.keyClick(composer.input, Qt.Key.Key_Return)


def wait_reply(qtbot, window, timeout: int = 30_000) -> None:
    qtbot.waitUntil(lambda: not window.session.busy, timeout=timeout)
    qtbot.wait(80)     # let the last refresh reach the widgets


class ScriptedBackend:
    """A chat backend that replies with a fixed script of (content, reasoning) deltas, on a timer."""

    supports_vision = False
    max_context = 32768
    takes_tools = False

    def __init__(self, script, metrics=None, tool_calls=None):
        from PySide6.QtCore import QObject, Signal

        class Signals(QObject):
            delta = Signal(str, str, str, int)
            reply_finished = Signal(str, object)
            warmed = Signal(int)

        self._signals = Signals()
        self.delta, self.reply_finished = self._signals.delta, self._signals.reply_finished
        self.warmed = self._signals.warmed
        self.script, self.metrics, self.tool_calls = script, metrics or {}, tool_calls or []

    def writer(self) -> dict:
        return {"name": "scripted"}

    def generate(self, request_id, messages, params, template_kwargs):
        from PySide6.QtCore import QTimer

        from app.generation import ReplyResult

        steps = list(self.script)

        def step():
            if steps:
                text, reasoning = steps.pop(0)
                self.delta.emit(request_id, text, reasoning, 1)
                QTimer.singleShot(5, step)
            else:
                self.reply_finished.emit(request_id, ReplyResult("stop", metrics=self.metrics,
                                                                 tool_calls=self.tool_calls))

        QTimer.singleShot(5, step)

    def cancel(self, request_id):
        pass

    def count_tokens(self, messages, template_kwargs):
        return None

    def warm(self, messages, template_kwargs):
        pass
