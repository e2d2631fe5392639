"""Settings → Tools: the tool servers (MCP), added from mcpServers JSON, the built-in ones switched on with one
click, each one's status, and the cap on tool rounds in one reply."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFrame, QGridLayout, QHBoxLayout, QLabel, QPlainTextEdit,
                               QSpinBox, QVBoxLayout)

from app import dialogs
from app.switch import Switch
from app.tools.config import BUILTINS, ServerConfig, ToolSettings, parse_servers
from app.tools.toolbox import ToolBox
from app.widgets import Card, clear_layout, icon_button, label, text_button

WARNING = ("A tool server is a program that runs with your rights: it can read, change or send whatever you could. "
           "Add only servers you trust. The model's calls run only once you allow them (or chose “Always allow” "
           "for that tool); a server at a URL receives the arguments of the calls you allow.")
BUILTIN_TITLES = {"calculator-clock": "Calculator and clock", "files": "Files in one folder"}
EXAMPLE = json.dumps({"mcpServers": {
    "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer …"}}}},
    indent=2, ensure_ascii=False)
STATE_WORDS = {"stopped": "Starts when a chat uses it", "starting": "Starting…", "ready": "Running",
               "failed": "Failed"}


class ToolsCard(Card):
    def __init__(self, toolbox: ToolBox, parent=None):
        super().__init__(parent, spacing=10)
        self.toolbox = toolbox
        self.setObjectName("card")
        self.body.addWidget(label("Tools", "cardTitle"))
        self.body.addWidget(label("Tool servers (MCP) give the model functions to call in a chat. Turn them on per "
                                  "chat from the tool button above the conversation.", "muted", wrap=True))
        warning = label("⚠ " + WARNING, "toolsWarning", wrap=True)
        self.body.addWidget(warning)
        self.body.addWidget(label("Built-in", "sectionTitle"))
        self.builtin_switches: dict[str, Switch] = {}
        self.builtin_rows = QGridLayout()
        self.builtin_rows.setColumnStretch(1, 1)
        for row, (name, (_script, what)) in enumerate(BUILTINS.items()):
            switch = Switch()
            switch.setAccessibleName(BUILTIN_TITLES[name])
            switch.toggled.connect(lambda on, n=name: self._switch_builtin(n, on))
            self.builtin_switches[name] = switch
            self.builtin_rows.addWidget(switch, row, 0, Qt.AlignmentFlag.AlignTop)
            self.builtin_rows.addWidget(label(f"<b>{BUILTIN_TITLES[name]}</b> — {what}", wrap=True), row, 1)
        self.folder_button = text_button("Choose folder…", "folder")
        self.folder_button.clicked.connect(self.choose_folder)
        self.builtin_rows.addWidget(self.folder_button, len(BUILTINS) - 1, 2, Qt.AlignmentFlag.AlignTop)
        self.body.addLayout(self.builtin_rows)
        self.body.addWidget(label("Servers", "sectionTitle"))
        self.rows = QVBoxLayout()
        self.rows.setSpacing(6)
        self.body.addLayout(self.rows)
        buttons = QHBoxLayout()
        self.add_button = text_button("Add servers from JSON…", "plus")
        self.add_button.clicked.connect(self.open_import)
        buttons.addWidget(self.add_button)
        buttons.addStretch(1)
        buttons.addWidget(label("Tool rounds per reply, at most", "formLabel"))
        self.max_rounds = QSpinBox()
        self.max_rounds.setRange(1, 50)
        self.max_rounds.valueChanged.connect(self._set_max_rounds)
        buttons.addWidget(self.max_rounds)
        self.body.addLayout(buttons)
        self.allowed = label("", "muted", wrap=True)
        self.forget = text_button("Ask again for every tool")
        self.forget.clicked.connect(self._forget_allowed)
        allowed_row = QHBoxLayout()
        allowed_row.addWidget(self.allowed, 1)
        allowed_row.addWidget(self.forget)
        self.body.addLayout(allowed_row)
        self.status_labels: dict[str, QLabel] = {}
        toolbox.settings_changed.connect(self.refresh)
        toolbox.status_changed.connect(self._show_status)
        self.refresh()

    # ---- what is shown -------------------------------------------------------------------------
    def refresh(self) -> None:
        s = self.toolbox.settings
        for name, switch in self.builtin_switches.items():
            server = s.server(name)
            switch.blockSignals(True)
            switch.setChecked(server is not None and server.builtin == name and not server.disabled)
            switch.blockSignals(False)
        files = s.server("files")
        self.folder_button.setToolTip(files.folder if files and files.folder else "No folder chosen yet")
        clear_layout(self.rows)
        self.status_labels.clear()
        for server in s.servers:
            self.rows.addWidget(self._row(server))
        if not s.servers:
            self.rows.addWidget(label("None yet: add one from JSON, or switch a built-in one on.", "muted"))
        self.max_rounds.blockSignals(True)
        self.max_rounds.setValue(s.max_rounds)
        self.max_rounds.blockSignals(False)
        n = len(s.always_allowed)
        self.allowed.setText(f"Always allowed: {', '.join(s.always_allowed)}" if n else
                             "Every tool call asks you first.")
        self.forget.setVisible(bool(n))

    def _row(self, server: ServerConfig) -> QFrame:
        row = QFrame()
        row.setObjectName("toolServerRow")
        line = QHBoxLayout(row)
        line.setContentsMargins(10, 6, 6, 6)
        switch = Switch()
        switch.setChecked(not server.disabled)
        switch.setToolTip("On: chats may use it")
        switch.toggled.connect(lambda on, n=server.name: self._set_disabled(n, not on))
        line.addWidget(switch, 0, Qt.AlignmentFlag.AlignTop)
        text = QVBoxLayout()
        text.setSpacing(2)
        kind = "built-in" if server.builtin else ("Streamable HTTP" if server.url else "stdio")
        text.addWidget(label(f"<b>{server.name}</b>  <span style='color:#8b8e98'>{kind}</span>"))
        what = label(server.describe(), "muted", wrap=True)
        what.setTextFormat(Qt.TextFormat.PlainText)
        text.addWidget(what)
        status = label("", "toolServerStatus", wrap=True)
        status.setTextFormat(Qt.TextFormat.PlainText)
        text.addWidget(status)
        self.status_labels[server.name] = status
        self._show_status(server.name, self.toolbox.status(server.name))
        line.addLayout(text, 1)
        remove = icon_button("trash", f"Remove {server.name}")
        remove.clicked.connect(lambda _=False, n=server.name: self.toolbox.remove_server(n))
        line.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return row

    def _show_status(self, name: str, status) -> None:
        shown = self.status_labels.get(name)
        if shown is None:
            return
        words = STATE_WORDS.get(status.state, status.state)
        if status.state == "ready":
            words += f": {', '.join(t.name for t in status.tools) or 'no tools'}"
        elif status.message and status.state == "failed":
            words += f": {status.message}"
        shown.setText(words)
        shown.setProperty("state", status.state)
        shown.style().unpolish(shown)
        shown.style().polish(shown)

    # ---- changes -------------------------------------------------------------------------------
    def import_text(self, text: str) -> str:
        """Servers from pasted mcpServers JSON; "" when added, else why not."""
        try:
            servers = parse_servers(json.loads(text))
        except json.JSONDecodeError as e:
            return f"This is not JSON: {e}"
        except ValueError as e:
            return str(e)
        self.toolbox.add_servers(servers)
        return ""

    def open_import(self) -> None:
        ImportDialog(self).exec()

    def choose_folder(self) -> bool:
        folder = dialogs.folder_path(self, "The folder the files tool may read")
        if not folder:
            return False
        self.toolbox.add_servers([ServerConfig("files", builtin="files", folder=folder)])
        return True

    def _switch_builtin(self, name: str, on: bool) -> None:
        existing = self.toolbox.settings.server(name)
        if on and name == "files" and not (existing and existing.folder):
            if not self.choose_folder():
                self.refresh()
            return
        if existing is None:
            self.toolbox.add_servers([ServerConfig(name, builtin=name)])
        else:
            self._set_disabled(name, not on)

    def _set_disabled(self, name: str, disabled: bool) -> None:
        s = self.toolbox.settings
        for server in s.servers:
            if server.name == name:
                server.disabled = disabled
        self.toolbox.set_settings(s)

    def _set_max_rounds(self, value: int) -> None:
        s = self.toolbox.settings
        self.toolbox.set_settings(ToolSettings(s.servers, s.always_allowed, value))

    def _forget_allowed(self) -> None:
        s = self.toolbox.settings
        self.toolbox.set_settings(ToolSettings(s.servers, [], s.max_rounds))


class ImportDialog(QDialog):
    """Paste (or open) an mcpServers JSON document."""

    def __init__(self, card: ToolsCard):
        super().__init__(card)
        self.card = card
        self.setWindowTitle("Add tool servers")
        self.resize(620, 420)
        column = QVBoxLayout(self)
        column.addWidget(label("Paste the mcpServers JSON of Claude Desktop, LM Studio or Cursor, or open its file. "
                               "A stdio server is a command with args and env; a Streamable HTTP one a url with "
                               "headers.", wrap=True))
        column.addWidget(label("⚠ " + WARNING, "toolsWarning", wrap=True))
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText(EXAMPLE)
        column.addWidget(self.text, 1)
        self.problem = label("", "messageError", wrap=True)
        column.addWidget(self.problem)
        buttons = QDialogButtonBox()
        open_file = buttons.addButton("Open file…", QDialogButtonBox.ButtonRole.ActionRole)
        open_file.clicked.connect(self._open_file)
        buttons.addButton("Add", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._add)
        buttons.rejected.connect(self.reject)
        column.addWidget(buttons)

    def _open_file(self) -> None:
        path = dialogs.open_path(self, "mcpServers JSON", "JSON (*.json)")
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    self.text.setPlainText(f.read())
            except (OSError, UnicodeDecodeError) as e:
                self.problem.setText(f"Could not read it: {e}")

    def _add(self) -> None:
        problem = self.card.import_text(self.text.toPlainText())
        self.problem.setText(problem)
        if not problem:
            self.accept()
