"""Settings' card of the packaged app (installer/launcher.py names the runtime folder in QWENDESK_RUNTIME): the
PyTorch engine it downloaded at its first start, where it is, how much it takes, and "Remove and quit…" (the files
go once the app has quit: a running engine holds them and Windows will not delete them before; the launcher
removes them, so that deleting the AppImage or uninstalling leaves nothing of that size behind); and the opt-in
update check (app/update_check.py), with what it found."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout

from app.dialogs import confirm
from app.formatting import human_bytes
from app.switch import Switch
from app.update_check import Release
from app.widgets import Card, label, text_button

RUNTIME_ENV = "QWENDESK_RUNTIME"               # the runtime folder in use (set by the launcher)
REMOVE_ENV = "QWENDESK_REMOVE_RUNTIME"         # set on the way out: the launcher removes the runtime after the app


def runtime_folder() -> Path | None:
    folder = os.environ.get(RUNTIME_ENV)
    return Path(folder) if folder and Path(folder).is_dir() else None


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


class RuntimeCard(Card):
    quit_requested = Signal()

    def __init__(self, folder: Path, parent=None):
        super().__init__(spacing=12, parent=parent)
        self.folder = folder
        self.runtime_bytes = folder_bytes(folder)
        self.body.addWidget(label("Installed app", "cardTitle"))
        self.summary = label(f"Its PyTorch engine: {human_bytes(self.runtime_bytes)} in {folder.parent}, downloaded at "
                             f"the first start. Removing it frees that space; the next start downloads it again.",
                             "muted", wrap=True, selectable=True)
        self.body.addWidget(self.summary)
        row = QHBoxLayout()
        row.addStretch(1)
        self.remove = text_button("Remove and quit…", kind="danger")
        self.remove.clicked.connect(self.ask)
        row.addWidget(self.remove)
        self.body.addLayout(row)
        self.check_updates = Switch("Check for a new version at each start (asks github.com; nothing is installed)")
        self.body.addWidget(self.check_updates)
        self.update_note = label("", "body", wrap=True)
        self.update_note.setOpenExternalLinks(True)
        self.update_note.hide()
        self.body.addWidget(self.update_note)

    def show_release(self, release: Release) -> None:
        self.update_note.setText(f'Qwen Desk {release.version} is available: <a href="{release.url}">its release '
                                 f'page</a>.')
        self.update_note.show()

    def ask(self) -> None:
        if confirm(self, "Remove the PyTorch engine?",
                   f"Qwen Desk quits and removes its PyTorch engine ({human_bytes(self.runtime_bytes)} in "
                   f"{self.folder.parent}). Conversations, settings and models stay.", "Remove and quit"):
            self.request_removal()

    def request_removal(self) -> None:
        os.environ[REMOVE_ENV] = "1"
        self.quit_requested.emit()
