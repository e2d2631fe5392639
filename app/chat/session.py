"""ChatSession: the chat's logic, apart from its widgets.

It keeps the conversation in the store, builds the history a backend needs, streams a reply
into the store (saved every few seconds while it streams, and at the end) and tells the page
what changed through signals. A backend (app/backend.py ChatBackend) is the EngineThread or a RemoteBackend: both
take generate(request_id, messages, params, template_kwargs) / cancel(request_id) / count_tokens(messages,
template_kwargs) and answer with delta (with the number of tokens it carries) and reply_finished signals.
Before a reply starts, the history is fitted into the context (context_fit.py); a reply cut short by its
token limit can be continued in the same message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QTimer, Signal

from app.backend import ChatBackend
from app.chat.blocks import extract_tool_calls
from app.chat.context_fit import fit_history, prompt_budget
from app.chat.presets import apply_overrides
from app.generation import ReplyResult
from app.settings import AppSettings
from app.store import VERSION_FIELDS, Conversation, Message, Store

SAVE_EVERY_S = 2.0
REFRESH_MS = 50
TITLE_LENGTH = 48
NO_VISION = ("The model in use does not take images, so the image was not sent: "
             "the model only sees your text.")
STATUS = {"stop": "complete", "length": "complete", "cancelled": "stopped", "error": "error"}
CONTEXT_FULL = ("This conversation no longer fits the model's context ({tokens:,} tokens; {budget:,} leave room "
                "for a reply), so nothing was sent. Start a new chat, or leave out its oldest messages.")
TURN_TOO_LONG = ("The latest message alone does not fit the model's context ({budget:,} tokens leave room for a "
                 "reply), so nothing was sent. Shorten it, or load the model with a longer context.")


def title_from(text: str) -> str:
    """A new conversation's title: its first line, cut at a word with an ellipsis when long."""
    line = (text.strip().splitlines() or ["Images"])[0].strip()
    if len(line) <= TITLE_LENGTH:
        return line or "New chat"
    cut = line[:TITLE_LENGTH].rsplit(" ", 1)[0] if " " in line[:TITLE_LENGTH] else line[:TITLE_LENGTH]
    return cut.rstrip(" ,;:.-") + "…"


@dataclass
class ActiveReply:
    message: Message
    request_id: str
    started: float = field(default_factory=time.monotonic)
    content: str = ""
    reasoning: str = ""
    thinking_s: float | None = None
    saved_at: float = field(default_factory=time.monotonic)
    prompt_tokens: int | None = None     # counted before sending (None: the backend cannot count)
    tokens: int = 0                      # streamed so far
    first_token_at: float | None = None
    earlier: dict | None = None          # a continued reply: its metrics before
    writer: dict = field(default_factory=dict)   # the model that writes it (metrics["model"]: name, weights, drafts)

    @property
    def tok_s(self) -> float | None:
        """Tokens per second since the first one."""
        if self.first_token_at is None or self.tokens < 2:
            return None
        elapsed = time.monotonic() - self.first_token_at
        return (self.tokens - 1) / elapsed if elapsed > 0 else None


class ChatSession(QObject):
    conversations_changed = Signal()
    opened = Signal(object, list)          # Conversation | None, messages
    message_added = Signal(object)         # Message in the open conversation
    message_removed = Signal(int)
    message_changed = Signal(object)       # a Message whose shown version changed
    reply_updated = Signal(int, str, str)  # message id, content so far, reasoning so far
    reply_finished = Signal(object)        # the final Message
    busy_changed = Signal(bool)
    context_changed = Signal(int, object, int)  # tokens used, context size (None: unknown), messages left out
    cache_warmed = Signal(int)             # the open conversation's tokens the next reply will not recompute

    def __init__(self, store: Store, settings: Callable[[], AppSettings], parent=None):
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.backend: ChatBackend | None = None
        self.current: Conversation | None = None
        self.active: ActiveReply | None = None
        self._editing: Message | None = None
        self.pending_options: dict = {}        # a new chat's own settings, kept once its first message is
        self.left_out = 0                      # oldest messages of the open conversation the last reply did not see
        self._refresh = QTimer(self)
        self._refresh.setSingleShot(True)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self._emit_update)

    # ---- backend -------------------------------------------------------------------------------
    def set_backend(self, backend: ChatBackend | None) -> None:
        if backend is self.backend:
            return
        self.stop()
        if self.backend is not None:
            self.backend.delta.disconnect(self._on_delta)
            self.backend.reply_finished.disconnect(self._on_finished)
            self.backend.warmed.disconnect(self.cache_warmed)
        self.backend = backend
        if backend is not None:
            backend.delta.connect(self._on_delta)
            backend.reply_finished.connect(self._on_finished)
            backend.warmed.connect(self.cache_warmed)
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
        self.pending_options = {}
        self.left_out = 0
        self.opened.emit(None, [])
        self._emit_context()

    def open(self, conversation_id: int) -> None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return
        self.current = conversation
        self._editing = None
        self.left_out = 0
        messages = self.store.messages(conversation_id)
        if self.active and self.active.message.conversation_id == conversation_id:
            for m in messages:
                if m.id == self.active.message.id:
                    m.content, m.reasoning, m.status = self.active.content, self.active.reasoning, "streaming"
        self.opened.emit(conversation, messages)
        self._emit_context()
        warm = getattr(self.backend, "warm", None)
        if warm is not None and not self.busy and any(m.role == "assistant" for m in messages):
            warm(self._history(), {"enable_thinking": True})   # the flag changes only the prompt's tail

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        if self.current and self.current.id == conversation_id:
            self.current.title = title
        self.conversations_changed.emit()

    def set_pinned(self, conversation_id: int, pinned: bool) -> None:
        self.store.set_pinned(conversation_id, pinned)
        if self.current and self.current.id == conversation_id:
            self.current.pinned = pinned
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
            edited, self._editing = self._editing, None
            reply = self._reply_to(edited)
            if reply is not None and not (images and not self.vision):
                self._edit_exchange(edited, reply, text, images, thinking)
                return
            self._drop_from(edited)
        if self.current is None:
            self.current = self.store.create_conversation(title_from(text))
            if self.pending_options:
                self.current.options, self.pending_options = self.pending_options, {}
                self.store.set_conversation_options(self.current.id, self.current.options)
            self.conversations_changed.emit()
        self.message_added.emit(self.store.add_message(self.current.id, "user", content=text, attachments=images))
        if images and not self.vision:
            self.message_added.emit(self.store.add_message(self.current.id, "notice", content=NO_VISION))
            if not text:
                return
        self._start_reply(thinking)

    def regenerate(self, thinking: bool) -> None:
        """A new version of the last reply; the earlier ones are kept (show_version)."""
        if self.busy or self.current is None:
            return
        messages = self.store.messages(self.current.id)
        if not messages or messages[-1].role != "assistant":
            return
        self._start_reply(thinking, regenerating=messages[-1])

    def show_version(self, message_id: int, index: int) -> None:
        """Another version of a reply becomes the shown one, and the one the conversation goes on from; the message
        before it shows the text that version answered (an edit made a new version)."""
        if self.current is None or (self.active and self.active.message.id == message_id):
            return
        message = self.store.show_version(message_id, index)
        prompt = message.metrics.get("prompt")
        asked = self._asked(message)
        if prompt and asked is not None and (asked.content, asked.attachments) != (prompt["content"],
                                                                                   prompt["attachments"]):
            self.store.update_message(asked.id, content=prompt["content"], attachments=prompt["attachments"])
            self._retitle(asked, prompt["content"])
            self.opened.emit(self.current, self.store.messages(self.current.id))
        else:
            self.message_changed.emit(message)
        self._emit_context()

    def continue_reply(self, thinking: bool) -> None:
        """The last reply hit its token limit: it goes on in the same message."""
        if self.busy or self.current is None:
            return
        messages = self.store.messages(self.current.id)
        if not messages or messages[-1].role != "assistant" or messages[-1].metrics.get("finish") != "length":
            return
        self._start_reply(thinking, continuing=messages[-1])

    def set_context_policy(self, policy: str) -> None:
        """This conversation's own choice (the settings' policy otherwise)."""
        self.set_options({**self.options(), "context_policy": policy})

    def options(self) -> dict:
        """The open conversation's own settings (a new chat's, before it is saved)."""
        return self.current.options if self.current is not None else self.pending_options

    def set_options(self, options: dict) -> None:
        if self.current is None:
            self.pending_options = dict(options)
        else:
            self.current.options = dict(options)
            self.store.set_conversation_options(self.current.id, self.current.options)
        self._emit_context()

    def reply_settings(self) -> AppSettings:
        """The settings a reply in the open conversation uses: the defaults with its own sampling."""
        return apply_overrides(self.settings(), self.options().get("sampling", {}))

    def leave_out_oldest(self, thinking: bool) -> None:
        """The answer to a full context: this conversation leaves out its oldest turns from now on, and
        the last message gets its reply."""
        if self.busy or self.current is None:
            return
        self.set_context_policy("truncate")
        if [m.role for m in self.store.messages(self.current.id) if m.role != "notice"][-1:] == ["user"]:
            self._start_reply(thinking)

    def context_policy(self) -> str:
        own = self.options().get("context_policy")
        return own or self.settings().context_policy

    def count_draft(self, text: str, thinking: bool) -> tuple[int, int] | None:
        """(the draft's tokens, the prompt's tokens once it is sent), or None when the backend cannot count."""
        count = getattr(self.backend, "count_tokens", None)
        if count is None or not text.strip():
            return None
        history = self._history() if self.current is not None else self._system()
        kwargs = {"enable_thinking": thinking}
        with_draft = count(history + [{"role": "user", "content": text}], kwargs)
        if with_draft is None:
            return None
        before = count(history, kwargs) if history else 0
        return with_draft - (before or 0), with_draft

    def delete_message(self, message_id: int) -> None:
        """One message out of the conversation (not the reply streaming)."""
        if self.current is None or (self.active and self.active.message.id == message_id):
            return
        self.store.delete_message(message_id)
        self.message_removed.emit(message_id)
        self._emit_context()

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

    def _reply_to(self, asked: Message) -> Message | None:
        """The reply that answered the user message `asked`, when it is the next message."""
        later = [m for m in self.store.messages(asked.conversation_id) if m.id > asked.id]
        return later[0] if later and later[0].role == "assistant" else None

    def _asked(self, reply: Message) -> Message | None:
        """The user message a reply answers."""
        earlier = [m for m in self.store.messages(reply.conversation_id) if m.id < reply.id]
        return earlier[-1] if earlier and earlier[-1].role == "user" else None

    def _edit_exchange(self, edited: Message, reply: Message, text: str, images: list[str], thinking: bool) -> None:
        """An edited message keeps what it replaced: its reply's versions stay, each with the text it answered
        (`metrics["prompt"]`), and the answer to the new text is one more version of the same reply."""
        old = {"content": edited.content, "attachments": edited.attachments}

        def stamped(version: dict) -> dict:
            if version["metrics"].get("prompt"):
                return version
            return {**version, "metrics": {**version["metrics"], "prompt": old}}

        own = stamped({k: getattr(reply, k) for k in VERSION_FIELDS})
        self.store.update_message(reply.id, versions=[stamped(v) for v in reply.versions], metrics=own["metrics"])
        for m in self.store.messages(edited.conversation_id):
            if m.id > reply.id:
                self.store.delete_message(m.id)
        self.store.update_message(edited.id, content=text, attachments=images)
        self._retitle(edited, text)
        self.opened.emit(self.current, self.store.messages(self.current.id))
        self._start_reply(thinking, regenerating=self.store.message(reply.id))

    def _retitle(self, asked: Message, text: str) -> None:
        """The title follows the first message's text unless the user renamed the conversation."""
        first = next((m for m in self.store.messages(asked.conversation_id) if m.role == "user"), None)
        conversation = self.store.conversation(asked.conversation_id)
        if first is not None and first.id == asked.id and conversation.title in (title_from(first.content),
                                                                                 title_from(asked.content)):
            self.rename(conversation.id, title_from(text))

    def _drop_from(self, first: Message) -> None:
        for m in self.store.messages(first.conversation_id):
            if m.id >= first.id:
                self.store.delete_message(m.id)
                self.message_removed.emit(m.id)

    def _start_reply(self, thinking: bool, continuing: Message | None = None,
                     regenerating: Message | None = None) -> None:
        if self.backend is None:
            self._notice("No model is loaded: pick one on the Models page.")
            return
        kwargs = {"enable_thinking": thinking}
        if continuing is not None:
            kwargs["continue_final_message"] = True
        fit = self._fit(self._history(continuing, without=regenerating), kwargs)
        if fit is None:
            return
        writer = self.backend.writer()
        if regenerating is not None:
            message = self.store.new_version(regenerating.id)
            asked = self._asked(message)                   # the text this version answers (edits change it)
            message.metrics = {"model": writer, **({"prompt": {"content": asked.content,
                                                              "attachments": asked.attachments}} if asked else {})}
            self.store.update_message(message.id, metrics=message.metrics)
            self.active = ActiveReply(message, f"m{message.id}v{message.version}")
            self.message_changed.emit(message)
        elif continuing is None:
            message = self.store.add_message(self.current.id, "assistant", status="streaming",
                                             metrics={"model": writer})
            self.active = ActiveReply(message, f"m{message.id}")
            self.message_added.emit(message)
        else:
            message = continuing
            message.status = "streaming"
            self.active = ActiveReply(message, f"m{message.id}+{len(message.content) + len(message.reasoning)}",
                                      content=message.content, reasoning=message.reasoning, earlier=message.metrics)
            self.store.update_message(message.id, status="streaming")
            self.reply_updated.emit(message.id, message.content, message.reasoning)
        self.active.prompt_tokens = fit.tokens
        self.active.writer = writer
        self.busy_changed.emit(True)
        self._emit_context()
        self.backend.generate(self.active.request_id, fit.history, self.reply_settings().sampling_params(thinking),
                              kwargs)

    def _fit(self, history: list[dict], kwargs: dict):
        """The history that fits the context (context_fit.py), or None after saying why nothing is sent."""
        total = self.backend.max_context
        if not total:
            return fit_history(history, lambda _: None, 0)
        count = self.backend.count_tokens
        budget = prompt_budget(total, self.reply_settings().max_tokens)
        tokens = count(history, kwargs)
        if tokens is not None and tokens > budget and self.context_policy() == "stop":
            self._notice(CONTEXT_FULL.format(tokens=tokens, budget=budget), actions=["new_chat", "leave_out"])
            return None
        fit = fit_history(history, lambda h: tokens if h is history else count(h, kwargs), budget)
        if fit is None:
            self._notice(TURN_TOO_LONG.format(budget=budget))
            return None
        self.left_out = fit.left_out
        return fit

    def _notice(self, text: str, actions: list[str] = ()) -> None:
        """A line in the transcript; `actions`: the choices it offers (new_chat, leave_out)."""
        metrics = {"actions": list(actions)} if actions else {}
        self.message_added.emit(self.store.add_message(self.current.id, "notice", content=text, metrics=metrics))

    def _system(self) -> list[dict]:
        """The conversation's own system prompt, else the default one."""
        prompt = self.options().get("system_prompt") or self.settings().system_prompt
        return [{"role": "system", "content": prompt}] if prompt.strip() else []

    def _history(self, continuing: Message | None = None, without: Message | None = None) -> list[dict]:
        """The conversation as the backend takes it; `continuing`: the reply being continued comes last,
        whatever it holds so far; `without`: a reply about to be regenerated."""
        history = self._system()
        for m in self.store.messages(self.current.id):
            if without is not None and m.id == without.id:
                continue
            failed_or_empty = m.status == "error" or not (m.content or m.tool_calls)
            being_continued = continuing is not None and m.id == continuing.id
            if m.role == "notice" or (m.role == "assistant" and failed_or_empty and not being_continued):
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

    def _on_delta(self, request_id: str, text: str, reasoning: str, tokens: int) -> None:
        reply = self.active
        if reply is None or request_id != reply.request_id:
            return
        if reply.first_token_at is None:
            reply.first_token_at = time.monotonic()
        reply.tokens += tokens
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
            self._emit_context()

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
        metrics = dict(result.metrics, finish=result.finish_reason, model=reply.writer)
        if "prompt" in reply.message.metrics:
            metrics["prompt"] = reply.message.metrics["prompt"]
        if "prompt_tokens" in metrics:
            metrics["context_tokens"] = metrics["prompt_tokens"] + metrics.get("output_tokens", 0)
        if reply.earlier:                      # a continued reply: its numbers add up
            for key in ("output_tokens", "reasoning_tokens"):
                if key in reply.earlier or key in metrics:
                    metrics[key] = reply.earlier.get(key, 0) + metrics.get(key, 0)
            for key in ("prompt_tokens", "cached_tokens", "ttft_ms", "thinking_s"):
                if key in reply.earlier:
                    metrics[key] = reply.earlier[key]
        if reply.thinking_s is not None and "thinking_s" not in metrics:
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
        """What the context holds: while a reply streams, its prompt and the tokens so far; else what the
        last reply's request held."""
        total = self.backend.max_context if self.backend is not None else None
        used = 0
        if self.active is not None and self.active.prompt_tokens is not None:
            used = self.active.prompt_tokens + self.active.tokens
        elif self.current is not None:
            for m in reversed(self.store.messages(self.current.id)):
                if m.role == "assistant" and "prompt_tokens" in m.metrics:
                    written = m.metrics["prompt_tokens"] + m.metrics.get("output_tokens", 0)
                    used = m.metrics.get("context_tokens", written)
                    break
        self.context_changed.emit(used, total, self.left_out)
