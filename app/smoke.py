"""The smoke run of an installed or frozen app: QWENDESK_SMOKE=FOLDER.

The real window does the work, as a user would: it loads FOLDER/checkpoint (the engine thread), builds a
Python extension the way Triton builds its launcher stubs (its compiler, the bundle's Python headers: what a
GPU's first kernel launch needs), answers one chat turn typed into the composer, switches the local endpoint
on from the settings (port 0: a free one), then waits until FOLDER/quit appears (the driver,
installer/smoke.py, sends an OpenAI SDK request meanwhile) and quits. What happened goes to
FOLDER/events.jsonl, one JSON object per line, since a windowed Windows executable has no stdout. The app's
data lives in FOLDER/data, emptied first: the user's conversations are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer

from app.load_state import LoadedModel, LoadState, Phase

SMOKE_ENV = "QWENDESK_SMOKE"
STUB = """#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "qwendesk_smoke_stub", NULL, -1, methods};
PyMODINIT_FUNC PyInit_qwendesk_smoke_stub(void) { return PyModule_Create(&module); }
"""
PROMPT = "Hello! Say something short."
TIMEOUT_S = 600
TICK_MS = 50


def smoke_folder() -> Path | None:
    folder = os.environ.get(SMOKE_ENV)
    return Path(folder).resolve() if folder else None


def prepare(folder: Path) -> None:
    """Before the app touches its folders: data and Triton's cache (fresh each run, as on a first launch: no model
    loads by itself, the stub is compiled) and converted weights inside FOLDER."""
    for fresh in ("data", "triton-cache"):
        shutil.rmtree(folder / fresh, ignore_errors=True)
    os.environ["QWENDESK_DATA_DIR"] = str(folder / "data")
    os.environ["QWENDESK_CACHE_DIR"] = str(folder / "cache")
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton-cache")


def build_stub() -> dict:
    from triton.runtime.build import compile_module_from_src

    started = time.monotonic()
    module = compile_module_from_src(STUB, "qwendesk_smoke_stub")
    assert module.answer() == 42
    return {"seconds": round(time.monotonic() - started, 2), "cc": os.environ.get("CC", "")}


class SmokeRun(QObject):
    def __init__(self, window, folder: Path):
        super().__init__(window)
        self.window, self.folder = window, folder
        self.code = 1
        self._events = (folder / "events.jsonl").open("a", encoding="utf-8")
        self._last_tick = time.monotonic()
        self.max_stall_ms = 0.0               # the longest the GUI thread did not answer while the model loaded
        self._ticker = QTimer(self)
        self._ticker.setInterval(TICK_MS)
        self._ticker.timeout.connect(self._tick)
        self._quit_poll = QTimer(self)
        self._quit_poll.setInterval(100)
        self._quit_poll.timeout.connect(self._poll_quit)
        QTimer.singleShot(TIMEOUT_S * 1000, self, lambda: self._fail(f"no result within {TIMEOUT_S} s"))
        QTimer.singleShot(0, self, self._start)       # runs once the event loop is up: the window is usable

    def _emit(self, event: str, **fields) -> None:
        self._events.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        self._events.flush()

    def _fail(self, message: str) -> None:
        self._emit("failed", message=message)
        self.code = 1
        self.window.quit()

    def _tick(self) -> None:
        now = time.monotonic()
        self.max_stall_ms = max(self.max_stall_ms, (now - self._last_tick) * 1000 - TICK_MS)
        self._last_tick = now

    def _start(self) -> None:
        self._emit("window", visible=self.window.isVisible())
        self.window.engine.state_changed.connect(self._load_state_changed)
        self._last_tick = time.monotonic()
        self._ticker.start()
        self.window.load_model(str(self.folder / "checkpoint"))

    def _load_state_changed(self, state: LoadState) -> None:
        if state.phase is Phase.LOADED and state.model is not None:
            self._loaded(state.model)
        elif state.phase is Phase.FAILED:
            self._fail(f"load failed: {state.message}")

    def _loaded(self, model: LoadedModel) -> None:
        self._ticker.stop()
        self._emit("loaded", device=model.device, seconds=round(model.load_seconds, 3),
                   max_stall_ms=round(self.max_stall_ms, 1))
        try:
            self._emit("toolchain", **build_stub())
        except Exception as e:  # noqa: BLE001 (any failure to build is the finding)
            return self._fail(f"Triton could not build a stub: {type(e).__name__}: {e}")
        context = self.window.context
        context.save_settings(context.settings.copy(max_tokens=8, temperature=0.0, thinking=False))
        self.window.chat.composer.think_button.setChecked(False)
        self.window.session.reply_finished.connect(self._replied)
        composer = self.window.chat.composer
        composer.input.setPlainText(PROMPT)
        composer.input.submit.emit()

    def _replied(self, message) -> None:
        self._emit("reply", status=message.status, content=message.content, error=message.error,
                   output_tokens=message.metrics.get("output_tokens", 0))
        if message.status != "complete" or not message.metrics.get("output_tokens"):
            return self._fail(f"the chat turn ended {message.status}: {message.error}")
        old = self.window.context.settings
        new = old.copy(endpoint_enabled=True, endpoint_host="127.0.0.1", endpoint_port=0)
        self.window.engine.endpoint_changed.connect(self._endpoint)
        self.window.settings_page.settings_changed.emit(new, new.changed_fields(old))

    def _endpoint(self, status) -> None:
        if status.running:
            self._emit("endpoint", base_url=status.base_url, model=self.window.engine.model.name)
            self._quit_poll.start()
        elif status.message:
            self._fail(f"the endpoint did not start: {status.message}")

    def _poll_quit(self) -> None:
        if (self.folder / "quit").exists():
            self._quit_poll.stop()
            self._emit("quit")
            self.code = 0
            self.window.quit()
