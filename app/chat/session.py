"""ChatSession: the chat's logic, apart from its widgets.

It keeps the conversation in the store, builds the history a backend needs, streams a reply
into the store (saved every few seconds while it streams, and at the end) and tells the page
what changed through signals. A backend (app/backend.py ChatBackend) is the EngineThread or a RemoteBackend: both
take generate(request_id, messages, params, template_kwargs) / cancel(request_id) / count_tokens(messages,
template_kwargs) and answer with delta (with the number of tokens it carries) and reply_finished signals.
Before a reply starts, the history is fitted into the context (context_fit.py); a reply cut short by its
token limit can be continued in the same message.

With tool servers on in a conversation (its options' "tools"), a reply is a turn (ToolTurn): the servers' tools go
to the backend with the request, each call the reply makes waits for the user's approval (approval_needed; decide()),
runs on its server, and its result is stored as a "tool" message; then the model replies again, up to the cap of
rounds in the tool settings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal

from app.backend import ChatBackend
from app.chat import export
from app.chat.attachments import keep_bytes
from app.chat.blocks import ShownCall, extract_tool_calls
from app.chat.context_fit import Fit, fit_history, prompt_budget
from app.chat.presets import Presets, apply_overrides
from app.generation import ReplyResult
from app.settings import AppSettings
from app.store import VERSION_FIELDS, Conversation, Message, Store
from engine.api import Constraint, SamplingParams

if TYPE_CHECKING:
    from app.tools.toolbox import ToolBox

SAVE_EVERY_S = 2.0
REFRESH_MS = 50
TITLE_LENGTH = 48
NO_VISION = ("The model in use does not take images, so the image was not sent: "
             "the model only sees your text.")
STATUS = {"stop": "complete", "length": "complete", "cancelled": "stopped", "error": "error"}
CONTEXT_FULL = ("This conversation no longer fits the model's context ({tokens:,} tokens; {budget:,} leave room "
                "for a reply), so nothing was sent. Start a new chat, or leave out its oldest messages.")
TOOLS_CAPPED = ("The model called tools in {rounds} replies in a row, the most one turn may (Settings → Tools); "
                "it was not asked again. Send a message to go on.")
DENIED = "The user denied this call: it was not run."
IMAGE_SUFFIX = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp"}
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


@dataclass
class ToolApproval:
    """A call waiting for the user: its tool, server and arguments."""
    tool: str
    server: str
    arguments: dict


@dataclass
class ToolTurn:
    """A turn with tools on: its tools by name, the calls of the last reply still to run, and the rounds so far.
    (A new backend ends the turn: set_backend stops it.)"""
    thinking: bool
    backend: ChatBackend
    toolbox: ToolBox
    tools: dict = field(default_factory=dict)     # name -> ToolInfo
    queue: list = field(default_factory=list)     # ShownCall
    waiting: tuple | None = None                  # (ShownCall, ToolInfo) the user is asked about
    rounds: int = 0


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
    approval_needed = Signal(object)       # ToolApproval: a call waits for decide()
    approval_closed = Signal()             # the call asked about was decided, or the turn ended

    def __init__(self, store: Store, settings: Callable[[], AppSettings], parent=None):
        super().__init__(parent)
        self.store = store
        self.presets = Presets(store)          # the named sampling presets a conversation's settings start from
        self.settings = settings
        self.backend: ChatBackend | None = None
        self.current: Conversation | None = None
        self.active: ActiveReply | None = None
        self.toolbox: ToolBox | None = None    # the window's, or None: no tools
        self.turn: ToolTurn | None = None
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
        if self.active is not None:     # the old backend's finish may come after the disconnect: it ends here
            self._on_finished(self.active.request_id, ReplyResult("cancelled"))
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
        return self.active is not None or self.turn is not None

    # ---- conversations -------------------------------------------------------------------------
    def conversations(self, search: str = "") -> list[Conversation]:
        return self.store.conversations(search)

    def new_conversation(self) -> None:
        """An empty chat; it is saved once the first message is sent."""
        self._leave_turn()
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
        self._leave_turn()
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
        if self.backend is not None and not self.busy and any(m.role == "assistant" for m in messages):
            self.backend.warm(self._history(), {"enable_thinking": True})   # the flag changes only the prompt's tail

    def conversation(self, conversation_id: int) -> Conversation | None:
        return self.store.conversation(conversation_id)

    def export(self, conversation: Conversation, kind: str, path: str, model_name: str) -> None:
        """A conversation written to `path`: Markdown (kind "markdown": the versions shown, replies by `model_name`)
        or JSON (all it holds, images inside). OSError when the file cannot be written."""
        messages = self.store.messages(conversation.id)
        if kind == "markdown":
            text = export.to_markdown(conversation, messages, model_name)
        else:
            text = json.dumps(export.to_json(conversation, messages), ensure_ascii=False, indent=1)
        Path(path).write_text(text, encoding="utf-8")

    def import_file(self, path: str) -> None:
        """A JSON export as a new conversation, opened. OSError, UnicodeDecodeError or json.JSONDecodeError when the
        file cannot be read; ValueError saying why when it is not an export (nothing is stored then)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        conversation = export.import_json(self.store, data, keep_bytes)
        self.conversations_changed.emit()
        self.open(conversation.id)

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
            self.turn = None
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

    @property
    def max_context(self) -> int | None:
        """The backend's context in tokens; None without one, or when it does not say."""
        return self.backend.max_context if self.backend is not None else None

    def count_draft(self, text: str, thinking: bool) -> tuple[int, int] | None:
        """(the draft's tokens, the prompt's tokens once it is sent), or None when the backend cannot count."""
        if self.backend is None or not text.strip():
            return None
        count = self.backend.count_tokens
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
        self._editing = self._last_user_message()
        return self._editing

    def last_user_text(self) -> str:
        """The open conversation's last user message ("" when none): what a new chat starts from when this one no
        longer fits."""
        message = self._last_user_message()
        return message.content if message else ""

    def _last_user_message(self) -> Message | None:
        if self.current is None:
            return None
        users = [m for m in self.store.messages(self.current.id) if m.role == "user"]
        return users[-1] if users else None

    def cancel_edit(self) -> None:
        self._editing = None

    def stop(self) -> None:
        if self.active and self.backend is not None:
            self.backend.cancel(self.active.request_id)
        elif self.turn is not None:             # between replies: listing tools, asking, or running a call
            self._end_turn()

    # ---- tools ---------------------------------------------------------------------------------
    def tool_servers(self) -> list[str]:
        """The tool servers on in the open conversation that are configured and usable, when the backend takes tools."""
        if self.toolbox is None or not self.takes_tools:
            return []
        usable = {s.name for s in self.toolbox.usable()}
        return [name for name in self.options().get("tools", []) if name in usable]

    @property
    def takes_tools(self) -> bool:
        """The backend renders the tools and parses the calls (the local engine)."""
        return self.backend is not None and self.backend.takes_tools

    def set_tool_server(self, name: str, on: bool) -> None:
        names = [n for n in self.options().get("tools", []) if n != name] + ([name] if on else [])
        self.set_options({**self.options(), "tools": names})

    def decide(self, choice: str) -> None:
        """The user's answer to approval_needed: once | always | deny."""
        turn = self.turn
        if turn is None or turn.waiting is None:
            return
        call, info = turn.waiting
        turn.waiting = None
        self.approval_closed.emit()
        if choice == "deny":
            self._add_tool_message(call, info, "denied", DENIED)
            self._next_call()
            return
        if choice == "always":
            turn.toolbox.allow_always(info.server, info.name)
        self._run_call(call, info)

    def _list_tools(self, backend: ChatBackend, toolbox: ToolBox, servers: list[str], thinking: bool,
                    continuing: Message | None, regenerating: Message | None) -> None:
        turn = self.turn = ToolTurn(thinking, backend, toolbox)
        self.busy_changed.emit(True)
        toolbox.list_tools(servers, lambda found: self._tools_listed(turn, found, continuing, regenerating))

    def _tools_listed(self, turn: ToolTurn, found: dict, continuing, regenerating) -> None:
        if self.turn is not turn:               # stopped meanwhile
            return
        for server, tools in found.items():
            if isinstance(tools, str):
                self._notice(f"The tool server {server} could not start, so its tools are off for this reply: "
                             f"{tools}")
                continue
            for info in tools:
                turn.tools.setdefault(info.name, info)      # two servers with one name: the first one's
        self._send_reply(turn.backend, turn.thinking, continuing, regenerating)

    def _next_call(self) -> None:
        """The next call of the reply to ask about or run; none left: the model replies to the results."""
        turn = self.turn
        if turn is None:
            return
        if not turn.queue:
            if turn.rounds >= turn.toolbox.settings.max_rounds:
                self._notice(TOOLS_CAPPED.format(rounds=turn.rounds))
                self._end_turn()
            else:
                self._send_reply(turn.backend, turn.thinking)
            return
        call = turn.queue.pop(0)
        info = turn.tools.get(call.name)
        if info is None:
            self._add_tool_message(call, None, "error", f"There is no tool named {call.name!r}.")
            self._next_call()
        elif turn.toolbox.always_allowed(info.server, info.name):
            self._run_call(call, info)
        else:
            turn.waiting = (call, info)
            self.approval_needed.emit(ToolApproval(info.name, info.server, call.arguments))

    def _run_call(self, call: ShownCall, info) -> None:
        turn = self.turn
        if turn is None:
            return
        conversation = self._open.id

        def done(result) -> None:
            if self.store.conversation(conversation) is None:      # deleted while the call ran
                return
            self._add_tool_message(call, info, result.status, result.text, result.images, result.seconds, conversation)
            if self.turn is turn:
                self._next_call()

        turn.toolbox.call(info.server, info.name, call.arguments, done)

    def _add_tool_message(self, call: ShownCall, info, status: str, text: str, images=(), seconds: float = 0.0,
                          conversation: int | None = None) -> None:
        """A call's result as a "tool" message: what the model reads (content, images) and what the transcript shows
        (metrics: tool, server, arguments, status ok | error | timeout | denied, seconds)."""
        paths = [keep_bytes(data, IMAGE_SUFFIX.get(mime, ".png")) for mime, data in images]
        metrics = {"tool": call.name, "server": info.server if info else "", "arguments": call.arguments,
                   "status": status, "seconds": round(seconds, 3)}
        message = self.store.add_message(conversation or self._open.id, "tool", content=text, attachments=paths,
                                         metrics=metrics)
        self.message_added.emit(message)

    def _leave_turn(self) -> None:
        """Another conversation is opened: a turn between its replies (asking, running a call) ends; a reply still
        streaming finishes where it is, without running its calls."""
        if self.turn is not None and self.active is None:
            self._end_turn()

    def _end_turn(self) -> None:
        if self.turn is None:
            return
        waiting = self.turn.waiting is not None
        self.turn = None
        if waiting:
            self.approval_closed.emit()
        self.busy_changed.emit(False)
        self.conversations_changed.emit()
        self._emit_context()

    # ---- internals -----------------------------------------------------------------------------
    @property
    def _open(self) -> Conversation:
        """The open conversation, which a reply, a tool call or a notice is for (there is one whenever they happen)."""
        if self.current is None:
            raise RuntimeError("no conversation is open")
        return self.current

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
        self.opened.emit(self.current, self.store.messages(edited.conversation_id))
        self._start_reply(thinking, regenerating=self.store.message(reply.id))

    def _retitle(self, asked: Message, text: str) -> None:
        """The title follows the first message's text unless the user renamed the conversation."""
        first = next((m for m in self.store.messages(asked.conversation_id) if m.role == "user"), None)
        conversation = self.store.conversation(asked.conversation_id)
        if conversation is None or first is None or first.id != asked.id:
            return
        if conversation.title in (title_from(first.content), title_from(asked.content)):
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
        servers = self.tool_servers()
        if servers and self.toolbox is not None:
            self._list_tools(self.backend, self.toolbox, servers, thinking, continuing, regenerating)
        else:
            self._send_reply(self.backend, thinking, continuing, regenerating)

    def _send_reply(self, backend: ChatBackend, thinking: bool, continuing: Message | None = None,
                    regenerating: Message | None = None) -> None:
        kwargs: dict[str, object] = {"enable_thinking": thinking}
        if continuing is not None:
            kwargs["continue_final_message"] = True
        params = self.reply_settings().sampling_params(thinking)
        history = self._history(continuing, without=regenerating)
        if self.turn is not None and self.turn.tools:
            self._with_tools(self.turn, kwargs, params,
                             answering_user=bool(history) and history[-1]["role"] == "user")
        fit = self._fit(backend, history, kwargs)
        if fit is None:
            self._end_turn()
            return
        writer = backend.writer()
        if regenerating is not None:
            message = self.store.new_version(regenerating.id)
            asked = self._asked(message)                   # the text this version answers (edits change it)
            message.metrics = {"model": writer, **({"prompt": {"content": asked.content,
                                                              "attachments": asked.attachments}} if asked else {})}
            self.store.update_message(message.id, metrics=message.metrics)
            self.active = ActiveReply(message, f"m{message.id}v{message.version}")
            self.message_changed.emit(message)
        elif continuing is None:
            message = self.store.add_message(self._open.id, "assistant", status="streaming",
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
        backend.generate(self.active.request_id, fit.history, params, kwargs)

    def _with_tools(self, turn: ToolTurn, kwargs: dict, params: SamplingParams, answering_user: bool) -> None:
        """The turn's tools into the request: their schemas for the template, and the grammar that keeps each call
        valid. The conversation's tool_choice ("auto", "required" or a tool's name) holds for a reply to the user's
        message; one to tool results (or a regenerated final answer) may answer in text."""
        schemas = [info.schema() for info in turn.tools.values()]
        kwargs["tools"] = schemas
        choice = self.options().get("tool_choice", "auto") if answering_user else "auto"
        named = choice if choice in turn.tools else None
        params.constraint = Constraint(tools=schemas, tool_mode="required" if choice == "required" or named else "auto",
                                       tool_name=named)

    def _fit(self, backend: ChatBackend, history: list[dict], kwargs: dict) -> Fit | None:
        """The history that fits the context (context_fit.py), or None after saying why nothing is sent."""
        total = backend.max_context
        if not total:
            return fit_history(history, lambda _: None, 0)
        count = backend.count_tokens
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

    def _notice(self, text: str, actions: Sequence[str] = ()) -> None:
        """A line in the transcript; `actions`: the choices it offers (new_chat, leave_out)."""
        metrics = {"actions": list(actions)} if actions else {}
        self.message_added.emit(self.store.add_message(self._open.id, "notice", content=text, metrics=metrics))

    def _system(self) -> list[dict]:
        """The conversation's own system prompt, else the default one."""
        prompt = self.options().get("system_prompt") or self.settings().system_prompt
        return [{"role": "system", "content": prompt}] if prompt.strip() else []

    def _history(self, continuing: Message | None = None, without: Message | None = None) -> list[dict]:
        """The conversation as the backend takes it; `continuing`: the reply being continued comes last,
        whatever it holds so far; `without`: a reply about to be regenerated."""
        history = self._system()
        for m in self.store.messages(self._open.id):
            if without is not None and m.id == without.id:
                continue
            failed_or_empty = m.status == "error" or not (m.content or m.tool_calls)
            being_continued = continuing is not None and m.id == continuing.id
            if m.role == "notice" or (m.role == "assistant" and failed_or_empty and not being_continued):
                continue
            content = m.content
            if m.role == "tool" and m.attachments and not self.vision:
                content += f"\n[{len(m.attachments)} image(s) the model cannot see]"
            entry: dict[str, object] = {"role": m.role, "content": content}
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
        turn = self.turn
        shown = self.current is not None and self.current.id == message.conversation_id
        finished_calls = message.tool_calls and result.finish_reason in ("tool_calls", "stop")   # not cut short
        if turn is not None and finished_calls and turn.tools and shown:
            turn.rounds += 1
            turn.queue = [ShownCall.from_dict(c) for c in message.tool_calls]
            self._emit_context()
            self._next_call()
            return
        self.turn = None
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
