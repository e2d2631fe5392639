"""Settings' card for the PyTorch engine the packaged app downloaded at its first start (installer/launcher.py
names its folder in QWENDESK_RUNTIME): where it is, how much it takes, and "Remove and quit…". The files go once
the app has quit (a running engine holds them; Windows will not delete them before): the launcher removes them,
so that deleting the AppImage or uninstalling leaves nothing of that size behind."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout

from app.dialogs import confirm
from app.formatting import human_bytes
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
        self.size = folder_bytes(folder)
        self.body.addWidget(label("PyTorch engine", "cardTitle"))
        self.summary = label(f"Downloaded at the first start: {human_bytes(self.size)} in {folder.parent}. "
                             f"Removing it frees that space; the next start downloads it again.",
                             "muted", wrap=True, selectable=True)
        self.body.addWidget(self.summary)
        row = QHBoxLayout()
        row.addStretch(1)
        self.remove = text_button("Remove and quit…", kind="danger")
        self.remove.clicked.connect(self.ask)
        row.addWidget(self.remove)
        self.body.addLayout(row)

    def ask(self) -> None:
        if confirm(self, "Remove the PyTorch engine?",
                   f"Qwen Desk quits and removes its PyTorch engine ({human_bytes(self.size)} in "
                   f"{self.folder.parent}). Conversations, settings and models stay.", "Remove and quit"):
            self.request_removal()

    def request_removal(self) -> None:
        os.environ[REMOVE_ENV] = "1"
        self.quit_requested.emit()
