"""The chat page: conversations on the left; title, model and context gauge on top; the
transcript; the composer."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import QFrame, QHBoxLayout, QMenu, QToolButton, QVBoxLayout, QWidget

from app import dialogs, icons
from app.banners import BannerStack
from app.chat import export
from app.chat.chat_options import ChatOptionsDialog
from app.chat.composer import Composer, takes_drop
from app.chat.context_fit import prompt_budget
from app.chat.context_gauge import ContextGauge
from app.chat.conversation_list import ConversationList
from app.chat.session import ChatSession
from app.chat.message_view import NoticeView
from app.chat.transcript import Transcript
from app.formatting import human_tokens
from app.shortcuts import keys
from app.store import Message
from app.widgets import ElidedLabel, icon_button, label, text_button


DRAFT_COUNT_MS = 400
NARROW_PAGE = 760          # below this width the conversation list folds away (the header's button opens it)


class ChatPage(QWidget):
    open_models_requested = Signal()
    load_requested = Signal(str)              # checkpoint directory picked from the model menu
    cancel_load_requested = Signal()
    eject_requested = Signal()
    manage_tools_requested = Signal()         # Settings → Tools

    def __init__(self, session: ChatSession, thinking_default: bool,
                 local_models: Callable[[], list[tuple[str, str, bool]]], parent=None):
        """`local_models`: the checkpoints on disk for the model menu, as (name, path, loaded)."""
        super().__init__(parent)
        self.setAcceptDrops(True)            # the empty chat says "drop them here": the whole page takes them
        self.session = session
        self.local_models = local_models
        self.model_name = ""
        self.loading_name = ""
        self.conversations = ConversationList()
        self.title = ElidedLabel("New chat", "chatTitle")
        self.sidebar_button = icon_button("sidebar", "Show or hide the conversations (Ctrl+B)")
        self.sidebar_button.clicked.connect(self.toggle_sidebar)
        self._sidebar_wanted = True          # the user's choice; a narrow page folds the list whatever it is
        self._narrow = False
        self.options_button = icon_button("sliders", "This chat's system prompt and sampling")
        self.options_button.setCheckable(True)          # checked: the chat has settings of its own
        self.options_button.clicked.connect(self.edit_options)
        self.tools_button = icon_button("tool", "Tools in this chat")
        self.tools_button.setCheckable(True)            # checked: tool servers are on in this chat
        self.tools_menu = QMenu(self)
        self.tools_menu.aboutToShow.connect(self._fill_tools_menu)
        self.tools_button.setMenu(self.tools_menu)
        self.tools_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.model_badge = label("No model loaded", "modelBadge")
        self.choose_model = text_button("Choose a model", "models")
        self.model_menu = QMenu(self)
        self.model_menu.aboutToShow.connect(self._fill_model_menu)
        self.choose_model.setMenu(self.model_menu)
        self.gauge = ContextGauge()
        self.banner = BannerStack()
        self.banner.action_clicked.connect(lambda _action: self.open_models_requested.emit())
        self.transcript = Transcript()
        self.composer = Composer()
        self.composer.think_button.setChecked(thinking_default)
        self._draft_timer = QTimer(self)          # the draft is counted when typing pauses
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(DRAFT_COUNT_MS)
        self._draft_timer.timeout.connect(self._count_draft)
        self._layout()
        self._connect()
        self._shortcuts()
        self.refresh_conversations()
        self.session.new_conversation()

    def _layout(self) -> None:
        header = QFrame()
        header.setObjectName("chatHeader")
        top = QHBoxLayout(header)
        top.setContentsMargins(20, 10, 16, 10)
        top.setSpacing(12)
        top.addWidget(self.sidebar_button)
        top.addWidget(self.title, 1)
        top.addWidget(self.tools_button)
        top.addWidget(self.options_button)
        top.addWidget(self.gauge)
        top.addWidget(self.model_badge)
        top.addWidget(self.choose_model)
        composer_row = QHBoxLayout()
        composer_row.setContentsMargins(24, 0, 24, 18)
        composer_row.addStretch(1)
        composer_row.addWidget(self.composer, 100)
        composer_row.addStretch(1)
        self.composer.setMaximumWidth(860)
        main = QVBoxLayout()
        main.setContentsMargins(0, 0, 0, 0)
        main.setSpacing(0)
        main.addWidget(header)
        banner_row = QHBoxLayout()
        banner_row.setContentsMargins(20, 10, 20, 0)
        banner_row.addWidget(self.banner)
        main.addLayout(banner_row)
        main.addWidget(self.transcript, 1)
        main.addLayout(composer_row)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.conversations)
        row.addLayout(main, 1)

    def _connect(self) -> None:
        s = self.session
        self.conversations.new_requested.connect(self.new_chat)
        self.conversations.selected.connect(s.open)
        self.conversations.selected.connect(self._fold_if_narrow)
        self.conversations.renamed.connect(s.rename)
        self.conversations.delete_requested.connect(self.confirm_delete)
        self.conversations.pin_requested.connect(s.set_pinned)
        self.conversations.export_requested.connect(self.export_conversation)
        self.conversations.import_requested.connect(self.import_conversation)
        self.conversations.search_changed.connect(lambda _: self.refresh_conversations())
        self.composer.send_requested.connect(self._send)
        self.composer.stop_requested.connect(s.stop)
        self.composer.cancel_edit_requested.connect(self._cancel_edit)
        self.composer.edit_last_requested.connect(self._edit_last)
        self.composer.input.textChanged.connect(self._draft_timer.start)
        self.composer.think_button.toggled.connect(self._draft_timer.start)
        s.conversations_changed.connect(self.refresh_conversations)
        s.opened.connect(self._show_conversation)
        s.message_added.connect(self._add_message)
        s.message_removed.connect(self._remove_message)
        s.message_changed.connect(self._change_message)
        s.reply_updated.connect(self._update_reply)
        s.reply_finished.connect(self._finish_reply)
        s.busy_changed.connect(self._busy_changed)
        s.context_changed.connect(self.gauge.set_usage)
        s.cache_warmed.connect(self.gauge.set_cached)
        s.approval_needed.connect(self._ask_approval)
        s.approval_closed.connect(self.transcript.close_approval)
        for signal in (s.opened, s.reply_finished, s.message_removed):
            signal.connect(self._draft_timer.start)

    # ---- drops anywhere on the page go to the message box ---------------------------------------
    def dragEnterEvent(self, event) -> None:
        if takes_drop(event.mimeData()):
            event.acceptProposedAction()
            self.composer.set_drop_highlight(True)

    def dragLeaveEvent(self, event) -> None:
        self.composer.set_drop_highlight(False)

    def dropEvent(self, event) -> None:
        self.composer.drop(event.mimeData())
        event.acceptProposedAction()

    def _shortcuts(self) -> None:
        for action, run in (("new_chat", self.new_chat), ("search", self._search), ("sidebar", self.toggle_sidebar),
                            ("escape", self._escape)):
            QShortcut(QKeySequence(keys(action)), self, run)

    def new_chat(self) -> None:
        """An empty chat with the cursor in the message box (typed text went nowhere)."""
        self.session.new_conversation()
        self.composer.input.setFocus()

    def _fold_if_narrow(self) -> None:
        if self._narrow:
            self.conversations.hide()

    def toggle_sidebar(self) -> None:
        """Show or hide the conversation list; on a narrow page it is shown until a conversation is picked."""
        shown = not self.conversations.isVisible()
        self.conversations.setVisible(shown)
        if not self._narrow:
            self._sidebar_wanted = shown

    def _search(self) -> None:
        self.conversations.show()
        self.conversations.search.setFocus()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        narrow = self.width() < NARROW_PAGE
        if narrow != self._narrow:
            self._narrow = narrow
            self.conversations.setVisible(self._sidebar_wanted and not narrow)

    def _escape(self) -> None:
        """Esc stops a streaming reply, or leaves editing."""
        if self.session.busy:
            self.session.stop()
        elif self.composer.editing:
            self._cancel_edit()

    # ---- what the window tells the page --------------------------------------------------------
    def set_model(self, name: str, blocked_reason: str = "") -> None:
        """The model the chat talks to ("" when none) and why sending is impossible, if it is."""
        self.model_name, self.loading_name = name, ""
        self._set_badge(name or "No model loaded", "loaded" if name else "")
        self.choose_model.setText("Change model" if name else "Choose a model")
        self.composer.set_blocked(blocked_reason)
        self.composer.set_vision(self.session.vision)
        self._show_tools_state()
        self._refresh_hint()

    def set_loading(self, load) -> None:
        """A model is loading (app.load_progress.LoadProgress): the header says which, and how far."""
        first = self.loading_name != load.name or self.model_name
        self.model_name, self.loading_name = "", load.name
        fraction = load.fraction
        self._set_badge(f"Loading {load.name}…" + (f"  {fraction:.0%}" if fraction is not None else ""), "loading")
        if first:
            self.choose_model.setText("Change model")
            self.composer.set_blocked(f"Loading {load.name}…")
            self.composer.set_vision(False)
            self._refresh_hint()

    def _set_badge(self, text: str, state: str) -> None:
        self.model_badge.setText(text)
        self.model_badge.setProperty("state", state)
        self.model_badge.style().unpolish(self.model_badge)
        self.model_badge.style().polish(self.model_badge)

    def _fill_tools_menu(self) -> None:
        """The tool servers to switch on or off in this chat, their state, and the cap on tool rounds."""
        menu, toolbox = self.tools_menu, self.session.toolbox
        menu.clear()
        if toolbox is None:
            return
        servers = toolbox.usable()
        if not self.session.takes_tools:
            menu.addAction("Tools work with a model loaded here (not a remote server)").setEnabled(False)
        elif not servers:
            menu.addAction("No tool servers yet").setEnabled(False)
        else:
            menu.addSection("Tool servers in this chat")
        on = self.session.options().get("tools", [])
        for server in servers:
            status = toolbox.status(server.name)
            state = {"ready": f"{len(status.tools)} tools", "failed": "failed",
                     "starting": "starting…"}.get(status.state, "")
            action = menu.addAction(server.name + (f"  ({state})" if state else ""))
            action.setCheckable(True)
            action.setChecked(server.name in on)
            action.setToolTip(status.message or server.describe())
            action.toggled.connect(lambda checked, n=server.name: self._set_tool_server(n, checked))
        if servers:
            self._add_tool_choice(menu, toolbox, [s.name for s in servers if s.name in on])
            menu.addSeparator()
            menu.addAction(f"Each call asks you first; at most {toolbox.settings.max_rounds} tool rounds per reply"
                           ).setEnabled(False)
        menu.addAction(icons.icon("settings"), "Manage tool servers…", self.manage_tools_requested)

    def _add_tool_choice(self, menu: QMenu, toolbox, on: list[str]) -> None:
        """Whether the model may answer in text, must call a tool, or must call one named tool (tool_choice)."""
        choice = self.session.options().get("tool_choice", "auto")
        sub = menu.addMenu("When you send a message, the model…")
        group = QActionGroup(sub)
        tools = [t.name for name in on for t in toolbox.status(name).tools]
        for value, text in [("auto", "decides whether to call a tool"), ("required", "must call a tool")] + [
                (name, f"must call {name}") for name in tools]:
            action = sub.addAction(text)
            action.setCheckable(True)
            action.setChecked(value == choice)
            group.addAction(action)
            action.triggered.connect(lambda _=False, v=value: self.session.set_options(
                {**self.session.options(), "tool_choice": v}))
        if not tools:
            sub.addAction("(a server's tools are listed once it has started)").setEnabled(False)

    def _set_tool_server(self, name: str, on: bool) -> None:
        self.session.set_tool_server(name, on)
        self._show_tools_state()

    def _show_tools_state(self) -> None:
        on = self.session.tool_servers()
        self.tools_button.setChecked(bool(on))
        self.tools_button.setToolTip("Tools in this chat: " + ", ".join(on) if on else "Tools in this chat (none on)")

    def _fill_model_menu(self) -> None:
        self.model_menu.clear()
        for name, path, loaded in self.local_models():
            action = self.model_menu.addAction(name, partial(self.load_requested.emit, path))
            action.setCheckable(True)
            action.setChecked(loaded)
            action.setToolTip(path)
        if not self.model_menu.isEmpty():
            self.model_menu.addSeparator()
        if self.loading_name:
            self.model_menu.addAction(icons.icon("stop"), f"Cancel loading {self.loading_name}",
                                      self.cancel_load_requested)
        in_use = [name for name, _, is_loaded in self.local_models() if is_loaded]
        if in_use:
            self.model_menu.addAction(icons.icon("close"), f"Eject {in_use[0]}", self.eject_requested)
        self.model_menu.addAction(icons.icon("models"), "Download or manage models…", self.open_models_requested)

    def show_banner(self, kind: str, text: str, action: str = "") -> None:
        self.banner.show_message(kind, text, action)

    # ---- session -> widgets --------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        current = self.session.current.id if self.session.current else None
        self.conversations.set_conversations(self.session.conversations(self.conversations.search.text()), current)

    def _show_conversation(self, conversation, messages: list[Message]) -> None:
        self.title.setText(conversation.title if conversation else "New chat")
        self._show_options_state()
        self._show_tools_state()
        self.composer.stop_editing()
        self.transcript.clear()
        for message in messages:
            self._add_message(message, refresh=False)
        self._refresh_actions()
        self._refresh_hint()
        self.refresh_conversations()
        self.transcript.scroll_to_bottom()

    def _add_message(self, message: Message, refresh: bool = True) -> None:
        if self.session.current is None or message.conversation_id != self.session.current.id:
            return
        if message.role == "notice":
            self.transcript.add_notice(message).action_requested.connect(self._notice_action)
        elif message.role == "tool":
            self.transcript.add_tool_result(message)
        else:
            view = self.transcript.add_message(message, self.model_name)
            view.delete_requested.connect(lambda m=message: self._delete_message(m))
            if message.role == "assistant":
                view.regenerate_requested.connect(self._regenerate)
                view.continue_requested.connect(self._continue)
                view.version_requested.connect(lambda i, m=message: self.session.show_version(m.id, i))
            else:
                view.edit_requested.connect(self._edit_last)
        self.title.setText(self.session.current.title)
        if refresh:
            self._refresh_actions()
            self.transcript.scroll_to_bottom()

    def _ask_approval(self, approval) -> None:
        view = self.transcript.show_approval(approval.tool, approval.server, approval.arguments)
        view.decided.connect(self.session.decide)
        view.allow.setFocus()

    def _remove_message(self, message_id: int) -> None:
        self.transcript.remove_message(message_id)
        self._refresh_actions()

    def _change_message(self, message: Message) -> None:
        """A reply's shown version changed (switched to, or a new one regenerating)."""
        view = self.transcript.view_for(message.id)
        if view:
            view.finish(message)
            if message.status == "streaming":
                view.update_reply(message.content, message.reasoning, streaming=True)
                view.metrics.setText("")
        self._refresh_actions()

    def _update_reply(self, message_id: int, content: str, reasoning: str) -> None:
        view = self.transcript.view_for(message_id)
        if view:
            view.update_reply(content, reasoning, streaming=True)
            if self.session.active:
                view.set_live_rate(self.session.active.tokens, self.session.active.tok_s)

    def _finish_reply(self, message: Message) -> None:
        view = self.transcript.view_for(message.id)
        if view:
            view.finish(message)
        self._refresh_actions()

    def _busy_changed(self, busy: bool) -> None:
        self.composer.set_streaming(busy)
        self._refresh_actions()

    def _refresh_actions(self) -> None:
        """Only the last reply regenerates and only the last user message is edited; neither
        while a reply streams."""
        views = self.transcript.message_views()
        busy = self.session.busy
        last_user = next((v for v in reversed(views) if v.message.role == "user"), None)
        turn = [v for v in self.transcript.views if not isinstance(v, NoticeView)]     # tool results end a turn too
        last_reply = turn[-1] if turn and turn[-1] in views and turn[-1].message.role == "assistant" else None
        for view in views:
            if view.message.role == "user":
                view.set_can_edit(view is last_user and not busy)
            else:
                view.set_can_regenerate(view is last_reply and not busy)

    def _refresh_hint(self) -> None:
        if self.loading_name:
            hint = f"{self.loading_name} is loading; you can write your message meanwhile."
        elif not self.model_name:
            hint = "Load a model on the Models page to start chatting."
        elif self.session.vision:
            hint = "Ask anything. Attach images with the paperclip, drop them here or paste them."
        else:
            hint = "Ask anything."
        self.transcript.empty_state.hint.setText(hint)

    # ---- widgets -> session --------------------------------------------------------------------
    def _send(self, text: str, images: list[str]) -> None:
        self.composer.stop_editing()
        self.session.send(text, images, self.composer.think_button.isChecked())

    def _regenerate(self) -> None:
        self.session.regenerate(self.composer.think_button.isChecked())

    def _delete_message(self, message: Message) -> None:
        if dialogs.confirm(self, "Delete message", "Delete this message? The rest of the conversation stays.",
                           "Delete"):
            self.session.delete_message(message.id)

    def _continue(self) -> None:
        self.session.continue_reply(self.composer.think_button.isChecked())

    def _notice_action(self, action: str) -> None:
        """A full context's choices: a new chat (the unanswered message moves to the composer), or
        leaving out the oldest messages of this one."""
        if action == "leave_out":
            self.session.leave_out_oldest(self.composer.think_button.isChecked())
        elif action == "new_chat":
            unanswered = self.session.last_user_text()
            self.session.new_conversation()
            if unanswered:
                self.composer.input.setPlainText(unanswered)
            self.composer.input.setFocus()

    def edit_options(self) -> None:
        """The chat's own system prompt and sampling, in a dialog."""
        own = self.session.options()
        dialog = ChatOptionsDialog(self.session.presets, self.session.settings(), own, self)
        if dialog.exec():
            kept = {k: v for k, v in own.items() if k not in ("system_prompt", "sampling")}
            self.session.set_options({**kept, **dialog.options()})
            self._draft_timer.start()
        self._show_options_state()

    def _show_options_state(self) -> None:
        own = self.session.options()
        custom = bool(own.get("system_prompt") or own.get("sampling"))
        self.options_button.setChecked(custom)
        self.options_button.setToolTip("This chat has its own system prompt or sampling: change them" if custom
                                       else "This chat's system prompt and sampling")

    def _count_draft(self) -> None:
        """The draft's tokens under the composer, counted by the backend with the conversation so far."""
        text = self.composer.input.toPlainText()
        counted = self.session.count_draft(text, self.composer.think_button.isChecked()) if text.strip() else None
        total = self.session.max_context
        if counted is None or not total:
            self.composer.set_draft_count("")
            return
        draft, prompt = counted
        budget = prompt_budget(total, self.session.reply_settings().max_tokens)
        over = prompt > budget
        text = f"{human_tokens(draft)} token{'s' if draft != 1 else ''}"
        if draft > budget:
            text += "  ·  longer than the context holds: shorten it"
        elif over:
            text += ("  ·  the oldest messages will be left out to fit" if self.session.context_policy() == "truncate"
                     else "  ·  the conversation will no longer fit")
        self.composer.set_draft_count(text, f"With this message the prompt takes {prompt:,} of {total:,} tokens "
                                            f"({budget:,} leave room for a reply).", over)

    def _edit_last(self) -> None:
        """The last user message into the composer (its edit button, or Up in an empty composer)."""
        if self.composer.editing:
            return
        message = self.session.begin_edit()
        if message:
            self.composer.start_editing(message.content, message.attachments)

    def _cancel_edit(self) -> None:
        self.session.cancel_edit()
        self.composer.input.clear()
        self.composer.attachments.clear()
        self.composer.stop_editing()

    def export_conversation(self, conversation_id: int, kind: str) -> None:
        conversation = self.session.conversation(conversation_id)
        if conversation is None:
            return
        suffix, filter_ = (".md", "Markdown (*.md)") if kind == "markdown" else (".json", "JSON (*.json)")
        name = export.safe_file_name(conversation.title) + suffix
        path = dialogs.save_path(self, "Export conversation", name, filter_)
        if not path:
            return
        try:
            self.session.export(conversation, kind, path, self.model_name or "Assistant")
        except OSError as e:
            self.show_banner("error", f"Could not export the conversation: {e.strerror or e}.")
            return
        self.show_banner("info", f"Exported “{conversation.title}” to {path}.")

    def import_conversation(self) -> None:
        path = dialogs.open_path(self, "Import conversation", "Conversations (*.json)")
        if not path:
            return
        try:
            self.session.import_file(path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            self.show_banner("error", f"Could not read {Path(path).name}: {e}")
        except ValueError as e:
            self.show_banner("error", f"Could not import {Path(path).name}: {e}")

    def confirm_delete(self, conversation_id: int) -> None:
        conversation = self.session.conversation(conversation_id)
        if conversation and dialogs.confirm(self, "Delete conversation",
                                            f"Delete “{conversation.title}” and all its messages?", "Delete"):
            self.session.delete(conversation_id)
