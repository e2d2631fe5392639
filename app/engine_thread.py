"""EngineThread: the QThread that owns the Engine (and the local endpoint's server).

The GUI calls load / unload / generate / set_endpoint; they queue commands the thread runs in order, and results
come back as signals. The load state (app/load_state.py) is kept here, on the GUI thread: load() sets it at once, and
each load's reports (numbered: a stale one is dropped) change it as they arrive. A reply's events are passed on from
the engine's own thread as they come (Engine.submit's on_event), so a command queued while a reply streams (an
unload, a load, another reply) runs at once. cancel() goes straight to the engine (thread-safe); cancel_load() sets
the load's cancel event, which the engine checks at each step it reports (a new load or an unload cancels the one in
progress). Failures become signals with a message; nothing here raises into the GUI.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path

from PySide6.QtCore import QThread, Signal

from app.chat.attachments import image_problem
from app.chat.blocks import ShownCall
from app.endpoint import EndpointSettings, EndpointStatus, start_endpoint
from app.server_log import ServerLog
from app.formatting import weights_words
from app.generation import ReplyResult, metrics_from_engine
from app.load_state import Cancelled, Failed, Loaded, LoadedModel, LoadReport, LoadState, Progress, Unloaded
from engine.api import (ContextLengthError, Engine, EngineConfig, LoadCancelled, MemoryPlan, QueueFullError,
                        RequestHandle, ToolCall, add_calls, plan_for)

log = logging.getLogger("qwendesk.app")


def engine_messages(messages: list[dict]) -> list[dict]:
    """The chat history as Engine.submit takes it: tool-call arguments as dicts, and a message with
    stored images (paths under the attachments folder) as list content: an {"type": "image", "image":
    <the encoded file's bytes>} part per image, then the text. An image that cannot be read (gone, or not one the
    engine reads: `image_problem`) is left out, so that one bad file does not fail every later turn; the
    transcript marks it."""
    out = []
    for m in messages:
        entry = {k: v for k, v in m.items() if k != "images"}
        images = [path for path in m.get("images") or () if not image_problem(path)]
        if images:
            entry["content"] = [*({"type": "image", "image": Path(path).read_bytes()} for path in images),
                                {"type": "text", "text": m.get("content") or ""}]
        if entry.get("tool_calls"):
            entry["tool_calls"] = [ShownCall.from_dict(c).as_dict() for c in entry["tool_calls"]]
        out.append(entry)
    return out


def weights_text(plan: MemoryPlan) -> str:
    """How the planned weights load, in words: "int4 weights (14.6 GiB)"."""
    kind = weights_words(plan.weights, plan.weight_bits)
    return f"{kind} weights ({plan.weights_bytes / (1 << 30):.1f} GiB)"


class EngineThread(QThread):
    state_changed = Signal(object)          # LoadState: the new one (self.state)
    load_progress = Signal(object)          # LoadProgress: the load in progress reported a step
    _reported = Signal(int, object)         # the worker: load number, LoadReport (delivered on the GUI thread)
    warning = Signal(str)
    delta = Signal(str, str, str, int)      # request id, content text, reasoning text, tokens
    reply_finished = Signal(str, object)    # request id, ReplyResult
    endpoint_changed = Signal(object)       # EndpointStatus
    warmed = Signal(int)                    # prompt tokens a conversation's next turn reuses (warm())


    def __init__(self, parent=None):
        super().__init__(parent)
        self._commands: queue.Queue = queue.Queue()
        self._engine: Engine | None = None
        self._server = None
        self._endpoint: EndpointSettings | None = None
        self.server_log = ServerLog()            # the endpoint's last lines, for Settings
        self._handles: dict[str, RequestHandle] = {}
        self._cancelled: set[str] = set()        # cancelled before their reply started
        self._finished: set[str] = set()         # ended before submit returned (an engine closing meanwhile)
        self._handles_lock = threading.Lock()
        self._cancel_load = threading.Event()
        self._engine_name = ""                   # the worker's: the loaded engine's model, for the endpoint
        self.state = LoadState()                 # the GUI thread's: the one load state every page reads
        self._load_number = 0                    # the GUI thread's: the latest load asked for
        self._reported.connect(self._apply_report)
        self.start()

    # ---- GUI-thread API ------------------------------------------------------------------------
    def load(self, config: EngineConfig) -> None:
        self._cancel_load.set()                 # a load still running gives way to this one
        self._cancel_load = threading.Event()
        self._load_number += 1
        self._commands.put(("load", self._load_number, config, self._cancel_load))
        self._set_state(LoadState.loading(config.model))

    def cancel_load(self) -> None:
        self._cancel_load.set()

    def unload(self) -> None:
        self._cancel_load.set()
        self._commands.put(("unload", self._load_number))

    @property
    def model(self) -> LoadedModel | None:
        return self.state.model

    def _set_state(self, state: LoadState) -> None:
        self.state = state
        self.state_changed.emit(state)

    def _apply_report(self, number: int, report: LoadReport) -> None:
        """A report of the worker's, on the GUI thread: only the latest load's count."""
        if number != self._load_number:
            return
        if isinstance(report, Progress):
            if self.state.progress is not None:
                self.state.progress.update(report.stage, report.done, report.total)
                self.load_progress.emit(self.state.progress)
        else:
            self._set_state(self.state.after(report))

    def writer(self) -> dict:
        """What writes the replies now, as a message records it: the model, its weights, its speculation."""
        m = self.model
        return {"name": m.name, "weights": weights_words(m.plan.weights, m.plan.weight_bits),
                "drafts": m.plan.drafts} if m else {}

    def generate(self, request_id: str, messages: list[dict], params, template_kwargs: dict) -> None:
        self._commands.put(("generate", request_id, messages, params, template_kwargs))

    def cancel(self, request_id: str) -> None:
        with self._handles_lock:
            handle = self._handles.get(request_id)
            if handle is None:
                self._cancelled.add(request_id)
        if handle is not None:
            handle.cancel()

    def set_endpoint(self, settings: EndpointSettings | None) -> None:
        self._commands.put(("endpoint", settings))

    def warm(self, messages: list[dict], template_kwargs: dict) -> None:
        """Ahead of a conversation's next turn: its prefix read from the engine's disk tier into host memory (after
        a restart), so the turn restores it instead of computing it again; `warmed` says how many tokens."""
        self._commands.put(("warm", messages, template_kwargs))

    def count_tokens(self, messages: list[dict], template_kwargs: dict) -> int | None:
        """The prompt's tokens as the engine would run it (its template and tokenizer; safe from the GUI
        thread); None without a model or when the template refuses the conversation."""
        engine = self._engine
        if engine is None:
            return None
        try:
            return len(engine.encode_prompt(engine_messages(messages), **template_kwargs))
        except (ValueError, OSError):
            return None

    takes_tools = True

    @property
    def supports_vision(self) -> bool:
        """The loaded engine takes images (its checkpoint has a vision tower and it is on)."""
        return bool(self.model and self.model.vision)

    @property
    def max_context(self) -> int | None:
        return self.model.max_context if self.model else None

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Stop replies, the endpoint and the engine; True when the thread ended in time."""
        with self._handles_lock:
            handles = list(self._handles.values())
        for handle in handles:
            handle.cancel()
        self._cancel_load.set()
        self._commands.put(("quit",))
        return self.wait(timeout_ms)

    # ---- the thread ----------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            command, *args = self._commands.get()
            try:
                if command == "quit":
                    self._close_engine()
                    return
                if command == "load":
                    self._load(*args)
                elif command == "unload":
                    self._close_engine()
                    self._reported.emit(args[0], Unloaded())
                    self._restart_endpoint()
                elif command == "generate":
                    self._generate(*args)
                elif command == "warm":
                    self._warm(*args)
                elif command == "endpoint":
                    self._endpoint = args[0]
                    self._restart_endpoint()
            except Exception as e:  # keep the thread alive whatever happens
                log.exception("engine thread command %s failed", command)
                self.warning.emit(f"{type(e).__name__}: {e}")

    def _load(self, number: int, config: EngineConfig, cancel: threading.Event) -> None:
        self._close_engine()
        started = time.monotonic()
        name = Path(config.model).name
        report = partial(self._reported.emit, number)
        if cancel.is_set():
            return report(Cancelled())

        def progress(stage: str, done: int, total: int) -> None:
            report(Progress(stage, done, total))
        try:
            progress("Checking the memory plan", 0, 0)
            plan = plan_for(config)                # the engine's own decision, weights="auto" included
            if not plan.fits:
                raise MemoryError(plan.message)
            progress(f"Loading {weights_text(plan)}", 0, 0)
            engine = Engine(replace(config, weights=plan.weights), progress=progress, cancel=cancel,
                            freeze_gc=False)     # the window collects and freezes on its GUI thread (gc_guard)
            if cancel.is_set():                    # cancelled after the engine's last check
                engine.close()
                raise LoadCancelled(name)
        except LoadCancelled:
            return report(Cancelled())
        except MemoryError as e:
            return report(Failed(f"{name} does not fit: {e}"))
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            return report(Failed(f"{name} could not be loaded: {e}"))
        except Exception as e:
            log.exception("loading %s failed", config.model)
            return report(Failed(f"{name} could not be loaded: {type(e).__name__}: {e}"))
        self._engine, self._engine_name = engine, name
        report(Loaded(LoadedModel(name, config.model, engine.device.type, config.profile, engine.plan().max_context,
                                  engine.plan(), time.monotonic() - started, vision=engine.accepts_images)))
        self._restart_endpoint()

    def _warm(self, messages, template_kwargs) -> None:
        if self._engine is None:
            return
        try:
            future = self._engine.warm(engine_messages(messages), **template_kwargs)
        except (ValueError, OSError, RuntimeError) as e:     # the next send says what is wrong, if anything is
            log.debug("warming a conversation failed: %s", e)
            return
        future.add_done_callback(self._warmed)

    def _warmed(self, future: Future) -> None:
        if future.exception() is None:
            self.warmed.emit(future.result())

    def _generate(self, request_id: str, messages, params, template_kwargs) -> None:
        with self._handles_lock:
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
                self.reply_finished.emit(request_id, ReplyResult("cancelled"))
                return
        if self._engine is None:
            self.reply_finished.emit(request_id, ReplyResult("error", error="No model is loaded."))
            return
        on_event = self._reply_events(request_id)
        try:
            handle = self._engine.submit(engine_messages(messages), params, on_event=on_event, **template_kwargs)
        except (ContextLengthError, QueueFullError, ValueError, RuntimeError) as e:
            self.reply_finished.emit(request_id, ReplyResult("error", error=str(e)))
            return
        with self._handles_lock:
            if request_id not in self._finished:          # (a reply can end before submit returns: an engine closing)
                self._handles[request_id] = handle
            self._finished.discard(request_id)
            if request_id in self._cancelled:           # cancelled while it was being submitted
                self._cancelled.discard(request_id)
                handle.cancel()

    def _reply_events(self, request_id: str):
        """The reply's event handler: it runs on the engine's own thread, as each event comes, so that this thread
        goes on serving commands (a cancel, an unload, another load, the next reply) while the reply streams."""
        calls: list[ToolCall] = []                      # the engine's parsed calls (requests with tools)

        def on_event(event) -> None:
            try:
                add_calls(calls, event.pieces)
                if event.kind == "delta":
                    if event.text or event.reasoning or event.token_ids:
                        self.delta.emit(request_id, event.text, event.reasoning, len(event.token_ids))
                    return
                with self._handles_lock:
                    if self._handles.pop(request_id, None) is None:
                        self._finished.add(request_id)
                self.reply_finished.emit(request_id, ReplyResult(
                    event.finish_reason, error=event.error or "", text=event.text, reasoning=event.reasoning,
                    tool_calls=[{"name": c.name, "arguments": c.arguments} for c in calls],
                    metrics=metrics_from_engine(event.usage, event.timings)))
            except Exception:       # never into the engine's step (it would fail every request in flight)
                log.exception("passing on an event of reply %s failed", request_id)
        return on_event

    def _restart_endpoint(self) -> None:
        self._stop_endpoint()
        if self._endpoint is None:
            self.endpoint_changed.emit(EndpointStatus(False))
        elif self._engine is None:
            self.endpoint_changed.emit(EndpointStatus(False, message="Starts when a model is loaded"))
        else:
            self._server, status = start_endpoint(self._engine, self._endpoint, self._engine_name, self.server_log)
            if status.failed:
                self._endpoint = None           # not tried again at the next load: the window turns the switch off
            self.endpoint_changed.emit(status)

    def _stop_endpoint(self) -> None:
        if self._server is not None:
            try:
                self._server.stop()
            except Exception:
                log.exception("stopping the endpoint failed")
            self._server = None
            self.server_log.note("Stopped")

    def _close_engine(self) -> None:
        self._stop_endpoint()
        if self._engine is not None:
            self._engine.close()
            self._engine, self._engine_name = None, ""
