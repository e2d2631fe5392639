"""ChatSession: the chat's logic, apart from its widgets.

It keeps the conversation in the store, builds the history a backend needs, streams a reply
into the store (saved every few seconds while it streams, and at the end) and tells the page
what changed through signals. A backend is the EngineThread or a RemoteBackend: both take
generate(request_id, messages, params, template_kwargs) / cancel(request_id) and answer with
delta and reply_finished signals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.blocks import extract_tool_calls
from app.generation import ReplyResult
from app.settings import AppSettings
from app.store import Conversation, Message, Store

SAVE_EVERY_S = 2.0
REFRESH_MS = 50
TITLE_LENGTH = 48
NO_VISION = ("The loaded model has no vision enabled yet, so the image was not sent: "
             "the model only sees your text.")
STATUS = {"stop": "complete", "length": "complete", "cancelled": "stopped", "error": "error"}


@dataclass
class ActiveReply:
    message: Message
    request_id: str
    started: float = field(default_factory=time.monotonic)
    content: str = ""
    reasoning: str = ""
    thinking_s: float | None = None
    saved_at: float = field(default_factory=time.monotonic)


class ChatSession(QObject):
    conversations_changed = Signal()
    opened = Signal(object, list)          # Conversation | None, messages
    message_added = Signal(object)         # Message in the open conversation
    message_removed = Signal(int)
    reply_updated = Signal(int, str, str)  # message id, content so far, reasoning so far
    reply_finished = Signal(object)        # the final Message
    busy_changed = Signal(bool)
    context_changed = Signal(int, object)  # tokens used, context size (None: unknown)

    def __init__(self, store: Store, settings: Callable[[], AppSettings], parent=None):
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.backend = None
        self.current: Conversation | None = None
        self.active: ActiveReply | None = None
        self._editing: Message | None = None
        self._refresh = QTimer(self)
        self._refresh.setSingleShot(True)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self._emit_update)

    # ---- backend -------------------------------------------------------------------------------
    def set_backend(self, backend) -> None:
        if backend is self.backend:
            return
        self.stop()
        if self.backend is not None:
            self.backend.delta.disconnect(self._on_delta)
            self.backend.reply_finished.disconnect(self._on_finished)
        self.backend = backend
        if backend is not None:
            backend.delta.connect(self._on_delta)
            backend.reply_finished.connect(self._on_finished)
        self._emit_context()

    @property
    def busy(self) -> bool:
        return self.active is not None

    # ---- conversations -------------------------------------------------------------------------
    def conversations(self, search: str = "") -> list[Conversation]:
        return self.store.conversations(search)

    def new_conversation(self) -> None:
        """An empty chat; it is saved once the first message is sent."""
        self.current = None
        self._editing = None
        self.opened.emit(None, [])
        self._emit_context()

    def open(self, conversation_id: int) -> None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return
        self.current = conversation
        self._editing = None
        messages = self.store.messages(conversation_id)
        if self.active and self.active.message.conversation_id == conversation_id:
            for m in messages:
                if m.id == self.active.message.id:
                    m.content, m.reasoning, m.status = self.active.content, self.active.reasoning, "streaming"
        self.opened.emit(conversation, messages)
        self._emit_context()

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        if self.current and self.current.id == conversation_id:
            self.current.title = title
        self.conversations_changed.emit()

    def delete(self, conversation_id: int) -> None:
        if self.active and self.active.message.conversation_id == conversation_id:
            self.stop()
            self.active = None
            self.busy_changed.emit(False)
        self.store.delete_conversation(conversation_id)
        self.conversations_changed.emit()
        if self.current and self.current.id == conversation_id:
            self.new_conversation()

    # ---- sending -------------------------------------------------------------------------------
    def send(self, text: str, images: list[str], thinking: bool) -> None:
        if self.busy:
            return
        if self._editing is not None:
            self._drop_from(self._editing)
            self._editing = None
        if self.current is None:
            title = (text.strip().splitlines() or ["Images"])[0][:TITLE_LENGTH]
            self.current = self.store.create_conversation(title or "New chat")
            self.conversations_changed.emit()
        self.message_added.emit(self.store.add_message(self.current.id, "user", content=text, attachments=images))
        if images and not self.vision:
            self.message_added.emit(self.store.add_message(self.current.id, "notice", content=NO_VISION))
            if not text:
                return
        self._start_reply(thinking)

    def regenerate(self, thinking: bool) -> None:
        """Replace the last reply with a new one."""
        if self.busy or self.current is None:
            return
        messages = self.store.messages(self.current.id)
        if not messages or messages[-1].role != "assistant":
            return
        self.store.delete_message(messages[-1].id)
        self.message_removed.emit(messages[-1].id)
        self._start_reply(thinking)

    def begin_edit(self) -> Message | None:
        """The last user message, to edit; the next send() replaces it and what followed."""
        if self.busy or self.current is None:
            return None
        users = [m for m in self.store.messages(self.current.id) if m.role == "user"]
        self._editing = users[-1] if users else None
        return self._editing

    def cancel_edit(self) -> None:
        self._editing = None

    def stop(self) -> None:
        if self.active and self.backend is not None:
            self.backend.cancel(self.active.request_id)

    # ---- internals -----------------------------------------------------------------------------
    @property
    def vision(self) -> bool:
        """Whether the chat's backend takes images."""
        return bool(self.backend is not None and self.backend.supports_vision)

    def _drop_from(self, first: Message) -> None:
        for m in self.store.messages(first.conversation_id):
            if m.id >= first.id:
                self.store.delete_message(m.id)
                self.message_removed.emit(m.id)

    def _start_reply(self, thinking: bool) -> None:
        if self.backend is None:
            self.message_added.emit(self.store.add_message(
                self.current.id, "notice", content="No model is loaded: pick one on the Models page."))
            return
        history = self._history()
        message = self.store.add_message(self.current.id, "assistant", status="streaming")
        self.active = ActiveReply(message, f"m{message.id}")
        self.message_added.emit(message)
        self.busy_changed.emit(True)
        settings = self.settings()
        self.backend.generate(self.active.request_id, history, settings.sampling_params(thinking),
                              {"enable_thinking": thinking})

    def _history(self) -> list[dict]:
        settings = self.settings()
        history = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
        for m in self.store.messages(self.current.id):
            failed_or_empty = m.status == "error" or not (m.content or m.tool_calls)
            if m.role == "notice" or (m.role == "assistant" and failed_or_empty):
                continue
            entry = {"role": m.role, "content": m.content}
            if m.attachments and self.vision:
                entry["images"] = m.attachments
            if m.reasoning:
                entry["reasoning_content"] = m.reasoning
            if m.tool_calls:
                entry["tool_calls"] = m.tool_calls
            history.append(entry)
        return history

    def _on_delta(self, request_id: str, text: str, reasoning: str) -> None:
        reply = self.active
        if reply is None or request_id != reply.request_id:
            return
        if text and reply.thinking_s is None and reply.reasoning:
            reply.thinking_s = time.monotonic() - reply.started
        reply.content += text
        reply.reasoning += reasoning
        if not self._refresh.isActive():
            self._refresh.start()
        if time.monotonic() - reply.saved_at > SAVE_EVERY_S:
            self.store.update_message(reply.message.id, content=reply.content, reasoning=reply.reasoning)
            reply.saved_at = time.monotonic()

    def _emit_update(self) -> None:
        if self.active:
            self.reply_updated.emit(self.active.message.id, self.active.content, self.active.reasoning)

    def _on_finished(self, request_id: str, result: ReplyResult) -> None:
        reply = self.active
        if reply is None or request_id != reply.request_id:
            return
        self._refresh.stop()
        self.active = None
        content, calls = extract_tool_calls(reply.content + result.text)
        reasoning = reply.reasoning + result.reasoning
        if reply.thinking_s is None and reasoning and content:
            reply.thinking_s = time.monotonic() - reply.started
        metrics = dict(result.metrics, finish=result.finish_reason)
        if reply.thinking_s is not None:
            metrics["thinking_s"] = reply.thinking_s
        message = reply.message
        message.content, message.reasoning, message.metrics = content, reasoning, metrics
        message.tool_calls = calls + result.tool_calls
        message.status, message.error = STATUS.get(result.finish_reason, "complete"), result.error
        self.store.update_message(message.id, content=message.content, reasoning=message.reasoning,
                                  tool_calls=message.tool_calls, metrics=metrics, status=message.status,
                                  error=message.error)
        self.store.touch_conversation(message.conversation_id)
        self.reply_finished.emit(message)
        self.busy_changed.emit(False)
        self.conversations_changed.emit()
        self._emit_context()

    def _emit_context(self) -> None:
        total = getattr(self.backend, "max_context", None) if self.backend is not None else None
        used = 0
        if self.current is not None:
            for m in reversed(self.store.messages(self.current.id)):
                if m.role == "assistant" and "prompt_tokens" in m.metrics:
                    used = m.metrics["prompt_tokens"] + m.metrics.get("output_tokens", 0)
                    break
        self.context_changed.emit(used, total)
