"""The first-launch window: says which engine this machine gets and why, installs it with a progress bar, and
offers Try again after a failure (what was downloaded stays) and, for a machine without network, a folder of
wheels to install from. Under a smoke run (QWENDESK_SMOKE) a failure is written to its events and the window
closes, so that a test sees it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEventLoop, Qt, QThread, QTimer, Signal
from PySide6.QtWidgets import QApplication, QFileDialog, QHBoxLayout, QProgressBar, QVBoxLayout, QWidget

from installer.firstrun.install import Installer, InstallError, NoNetwork, Progress
from installer.firstrun.plan import RuntimePlan

log = logging.getLogger("qwendesk.firstrun")
GB = 1e9
POLL_MS = 100


def progress_text(progress: Progress) -> str:
    if progress.step == "Resolving":
        return "Asking the package index which files this machine needs…"
    if progress.step == "Downloading":
        return (f"Downloading {progress.done / GB:.2f} of {progress.total / GB:.2f} GB · file {progress.files + 1} of "
                f"{progress.count}: {progress.detail}" if progress.files < progress.count else "Downloaded")
    if progress.step == "Installing":
        return "Installing (unpacking the packages; a minute or two)"
    return progress.step


class InstallThread(QThread):
    """The install, off the GUI thread. Its progress is read by the window's timer ten times a second (`latest`),
    not signalled: the install reports every MiB, thousands of emits for a bar (PySide6 6.12.0 on Python 3.11 died
    of them: pyproject.toml excludes it)."""
    finished_ok = Signal(str)           # the runtime's folder
    failed = Signal(str, bool)          # what went wrong, whether it was the network

    def __init__(self, plan: RuntimePlan, parent=None):
        super().__init__(parent)
        self.latest: Progress | None = None
        self.installer = Installer(plan, self._report)

    def _report(self, progress: Progress) -> None:
        self.latest = dataclasses.replace(progress)       # a new object each time: the GUI reads a whole one

    def run(self) -> None:
        try:
            self.finished_ok.emit(str(self.installer.run()))
        except (InstallError, OSError) as e:
            self.failed.emit(str(e), isinstance(e, NoNetwork))


class FirstRunWindow(QWidget):
    done = Signal(object)               # the runtime's Path, or None when the user gave up

    def __init__(self, plan: RuntimePlan):
        from app.widgets import label, text_button

        super().__init__()
        self.plan = plan
        self.setWindowTitle("Qwen Desk: first start")
        self.setFixedWidth(600)
        self.message = label(plan.choice.message(plan.wheels), wrap=True)
        self.detail = label("", name="muted", wrap=True)
        self.bar = QProgressBar()
        self.bar.setObjectName("loadBar")
        self.bar.setTextVisible(False)
        self.retry = text_button("Try again", kind="primary")
        self.folder = text_button("Use a folder of wheels…")
        self.folder.setToolTip(f"Install from wheels downloaded on a machine with network, the same system and "
                               f"Python {plan.python}:\n{plan.download_command}")
        self.quit = text_button("Quit")
        self.retry.clicked.connect(self.start)
        self.folder.clicked.connect(self._pick_folder)
        self.quit.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(self.folder)
        buttons.addStretch(1)
        buttons.addWidget(self.quit)
        buttons.addWidget(self.retry)
        column = QVBoxLayout(self)
        column.setContentsMargins(24, 22, 24, 20)
        column.setSpacing(12)
        column.addWidget(label("Setting up Qwen Desk", name="pageTitle"))
        column.addWidget(self.message)
        column.addWidget(self.bar)
        column.addWidget(self.detail)
        column.addLayout(buttons)
        self.thread: InstallThread | None = None
        self._result: Path | None = None
        self._shown: Progress | None = None
        self.poll = QTimer(self)
        self.poll.setInterval(POLL_MS)
        self.poll.timeout.connect(self._poll)
        self._fit()

    def _fit(self) -> None:
        """Room for every line of the wrapped texts (a window's first layout does not ask for it)."""
        margins = self.layout().contentsMargins()
        width = self.width() - margins.left() - margins.right()
        for text in (self.message, self.detail):
            text.setMinimumHeight(max(0, text.heightForWidth(width)))
        self.adjustSize()

    def start(self) -> None:
        self.retry.hide()
        self.folder.hide()
        self.detail.setText("Starting…")
        self.bar.setRange(0, 0)
        self.thread = InstallThread(self.plan, self)
        self.thread.finished_ok.connect(self._finished)
        self.thread.failed.connect(self._failed)
        self.thread.start()
        self.poll.start()

    def _poll(self) -> None:
        latest = self.thread.latest if self.thread else None
        if latest is not None and latest is not self._shown:
            self._shown = latest
            self._progress(latest)

    def _progress(self, progress: Progress) -> None:
        self.detail.setText(progress_text(progress))
        self._fit()
        if progress.total:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * progress.done / progress.total))
        else:
            self.bar.setRange(0, 0)

    def _finished(self, runtime: str) -> None:
        self.poll.stop()
        self._result = Path(runtime)
        self.close()

    def _failed(self, message: str, offline: bool) -> None:
        self.poll.stop()
        log.error("installing the runtime failed: %s", message)
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        kept = "" if offline or self.plan.wheels else "\nWhat was downloaded is kept: Try again goes on from there."
        self.detail.setText(message + kept)
        self.retry.show()
        self.folder.show()
        self.folder.setObjectName("primary" if offline else "")
        self.folder.style().polish(self.folder)
        self._fit()
        if smoke := os.environ.get("QWENDESK_SMOKE"):       # a test drives this launch: report, show, and close
            self.grab().save(str(Path(smoke) / "firstrun.png"))
            with (Path(smoke) / "events.jsonl").open("a", encoding="utf-8") as events:
                events.write(json.dumps({"event": "failed", "message": message, "offline": offline,
                                         "time": time.time()}) + "\n")
            self.close()

    def use_wheels(self, folder: Path) -> None:
        """Install from a folder of wheels instead of the network."""
        self.plan = dataclasses.replace(self.plan, wheels=folder)
        self.message.setText(self.plan.choice.message(folder))
        self.start()

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A folder of wheels for Qwen Desk's engine")
        if folder:
            self.use_wheels(Path(folder))

    def closeEvent(self, event) -> None:
        if self.thread is not None and self.thread.isRunning():
            self.thread.installer.cancel()
            self.thread.wait()
        event.accept()
        self.done.emit(self._result)


def provision(plan: RuntimePlan) -> Path | None:
    """Show the window, install, and return the runtime's folder (None: the user quit first)."""
    from app.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme(app)
    quit_on_close = app.quitOnLastWindowClosed()
    app.setQuitOnLastWindowClosed(False)
    window = FirstRunWindow(plan)
    result: list[Path | None] = []
    loop = QEventLoop()
    window.done.connect(lambda runtime: (result.append(runtime), loop.quit()))
    window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    window.show()
    window.start()
    loop.exec()
    app.setQuitOnLastWindowClosed(quit_on_close)
    return result[0] if result else None
