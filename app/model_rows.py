"""The rows and cards of the Models page: a catalog entry, a download, a checkpoint on disk."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QVBoxLayout,
)

from app import icons
from app.catalog import CatalogEntry
from app.downloads import DownloadStatus
from app.formatting import human_bytes, human_duration
from app.load_state import LoadState, Phase
from app.local_models import LocalModel
from app.widgets import ElidedLabel, icon_button, label, set_enabled, text_button

STATE_TEXT = {"queued": "Queued", "preparing": "Preparing", "downloading": "Downloading", "stalled": "Stalled",
              "verifying": "Verifying", "paused": "Paused", "pausing": "Pausing…", "cancelling": "Cancelling…",
              "failed": "Failed", "ready": "Downloaded"}
SOURCE_TEXT = {"downloads": "Downloaded by Qwen Desk", "hf-cache": "Hugging Face cache", "folder": "Your folder"}


def badge(text: str, kind: str = "") -> QLabel:
    widget = label(text, "badge")
    widget.setProperty("kind", kind)
    return widget


def _restyle(widget) -> None:
    widget.style().unpolish(widget)
    widget.style().polish(widget)


class CatalogCard(QFrame):
    download_requested = Signal(str)       # repo id
    load_requested = Signal(str)           # checkpoint directory
    eject_requested = Signal()
    cancel_load_requested = Signal()

    def __init__(self, entry: CatalogEntry, recommended: bool, runs_as: str, too_large: str = "", parent=None):
        """too_large: the badge's words when the engine's plan does not fit this machine ("" when it does)."""
        super().__init__(parent)
        self.entry = entry
        self.too_large = ""
        self.local_path = ""
        self.engine_state = Phase.UNLOADED  # LOADING or LOADED: this card's model in the engine
        self.setObjectName("card")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        column = QVBoxLayout(self)
        column.setContentsMargins(16, 14, 16, 14)
        column.setSpacing(6)
        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(label(entry.name, "cardTitle"))
        top.addWidget(badge(entry.variant))
        if recommended:
            top.addWidget(badge("Recommended", "accent"))
        self.fit_badge = badge("", "danger")
        top.addWidget(self.fit_badge)
        top.addStretch(1)
        column.addLayout(top)
        column.addWidget(label(entry.id, "mono"))
        column.addWidget(label(entry.summary, "body", wrap=True))
        self.facts = label("", "facts", wrap=True)
        column.addWidget(self.facts)
        self.with_drafter = QCheckBox(f"Also its block drafter, {entry.drafter_gb:g} GB more: faster replies")
        self.with_drafter.setToolTip(f"{entry.drafter}: drafts several tokens a step for this model; Settings → "
                                     f"Block drafter uses it once both are downloaded")
        self.with_drafter.setVisible(bool(entry.drafter))
        column.addWidget(self.with_drafter)
        bottom = QHBoxLayout()
        self.state = label("", "muted")
        self.button = text_button("Download", "download", "primary")
        self.button.clicked.connect(self._clicked)
        self.set_runs_as(runs_as, too_large)
        bottom.addWidget(self.state, 1)
        bottom.addWidget(self.button)
        column.addLayout(bottom)

    def set_runs_as(self, runs_as: str, too_large: str = "") -> None:
        self.too_large = too_large
        self.fit_badge.setText(too_large)
        self.fit_badge.setVisible(bool(too_large))
        self.facts.setText(f"Download {self.entry.download_gb:g} GB   ·   {runs_as}")
        self._style_button()

    def _style_button(self) -> None:
        """A model that fits gets the primary button; one too large a plain one (it still downloads, after a
        question)."""
        primary = not self.too_large or bool(self.local_path)
        self.button.setObjectName("primary" if primary else "")
        _restyle(self.button)

    def _icon_color(self) -> str:
        return icons.ON_ACCENT if self.button.objectName() == "primary" else icons.TEXT

    def set_state(self, local_path: str, download: DownloadStatus | None,
                  engine_state: Phase = Phase.UNLOADED) -> None:
        """engine_state: LOADING or LOADED when this card's checkpoint is in the engine."""
        self.local_path, self.engine_state = local_path, engine_state if local_path else Phase.UNLOADED
        self.with_drafter.setVisible(bool(self.entry.drafter) and not local_path and download is None)
        self._style_button()
        if local_path:
            self.state.setText({Phase.LOADED: "Loaded", Phase.LOADING: "Loading…"}.get(self.engine_state,
                                                                                       "On this computer"))
            self.button.setText({Phase.LOADED: "Eject", Phase.LOADING: "Cancel"}.get(self.engine_state, "Load"))
            set_enabled(self.button, True, "")
            self.button.setIcon(icons.icon("play" if self.engine_state is Phase.UNLOADED else "close",
                                           self._icon_color()))
        elif download is not None and download.state in ("paused", "failed"):
            self.state.setText(f"{STATE_TEXT[download.state]}: {download.fraction:.0%}")
            self.button.setText("Resume")
            set_enabled(self.button, True, "")
            self.button.setIcon(icons.icon("play", self._icon_color()))
        elif download is not None:
            self.state.setText(f"{STATE_TEXT.get(download.state, download.state)}: {download.fraction:.0%}")
            self.button.setText("Downloading")
            set_enabled(self.button, False, "Downloading now: pause or delete it under Downloads above")
        else:
            self.state.setText("")
            self.button.setText("Download")
            set_enabled(self.button, True, "")
            self.button.setIcon(icons.icon("download", self._icon_color()))

    def _clicked(self) -> None:
        if self.engine_state is Phase.LOADED:
            self.eject_requested.emit()
        elif self.engine_state is Phase.LOADING:
            self.cancel_load_requested.emit()
        elif self.local_path:
            self.load_requested.emit(self.local_path)
        else:
            self.download_requested.emit(self.entry.id)


class DownloadRow(QFrame):
    pause_requested = Signal(str)
    resume_requested = Signal(str)
    cancel_requested = Signal(str)
    forget_requested = Signal(str)

    def __init__(self, repo_id: str, parent=None):
        super().__init__(parent)
        self.repo_id = repo_id
        self.setObjectName("downloadRow")
        column = QVBoxLayout(self)
        column.setContentsMargins(14, 10, 10, 10)
        column.setSpacing(6)
        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(label(repo_id, "rowTitle"))
        self.state = badge("")
        top.addWidget(self.state)
        top.addStretch(1)
        self.pause = icon_button("pause", "Pause")
        self.resume = icon_button("play", "Resume", icons.ACCENT)
        # destructive (asks first, app/models_page.py) and harmless actions look different: a bin, a cross
        self.cancel = icon_button("trash", "Cancel the download and delete its files…")
        self.forget = icon_button("close", "Remove from this list (the model stays on disk)")
        self.pause.clicked.connect(lambda: self.pause_requested.emit(repo_id))
        self.resume.clicked.connect(lambda: self.resume_requested.emit(repo_id))
        self.cancel.clicked.connect(lambda: self.cancel_requested.emit(repo_id))
        self.forget.clicked.connect(lambda: self.forget_requested.emit(repo_id))
        for button in (self.pause, self.resume, self.cancel, self.forget):
            top.addWidget(button)
        self.bar = QProgressBar()
        self.bar.setObjectName("downloadBar")
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(6)
        self.bar.setRange(0, 1000)
        self.detail = label("", "muted", wrap=True)
        column.addLayout(top)
        column.addWidget(self.bar)
        column.addWidget(self.detail)

    def set_status(self, status: DownloadStatus) -> None:
        state = status.state
        self.state.setText(STATE_TEXT.get(state, state))
        self.state.setProperty("kind", {"stalled": "warning", "failed": "danger", "ready": "success",
                                        "paused": ""}.get(state, "accent"))
        _restyle(self.state)
        self.bar.setValue(int(status.fraction * 1000))
        self.bar.setProperty("state", state)
        _restyle(self.bar)
        parts = []
        if status.total_bytes:
            parts.append(f"{human_bytes(status.done_bytes)} of {human_bytes(status.total_bytes)}")
        if state == "downloading" and status.speed > 0:
            parts.append(f"{human_bytes(status.speed)}/s")
            if status.eta_s is not None:
                parts.append(f"{human_duration(status.eta_s)} left")
        if status.message:
            parts.append(status.message)
        self.detail.setText("   ·   ".join(parts))
        running = status.active
        self.pause.setVisible(running)
        self.resume.setVisible(state in ("paused", "failed"))
        self.cancel.setVisible(state not in ("ready", "cancelling"))
        self.forget.setVisible(state == "ready")


class LocalModelRow(QFrame):
    load_requested = Signal(str)
    eject_requested = Signal()
    cancel_load_requested = Signal()
    delete_requested = Signal(object)      # LocalModel
    redownload_requested = Signal(object)  # LocalModel whose files are damaged

    def __init__(self, model: LocalModel, runs_as: str, parent=None):
        super().__init__(parent)
        self.model = model
        self.setObjectName("localRow")
        row = QHBoxLayout(self)
        row.setContentsMargins(14, 10, 10, 10)
        row.setSpacing(12)
        glyph = QLabel()
        glyph.setPixmap(icons.pixmap("models", 20, icons.ACCENT))
        row.addWidget(glyph)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(label(model.name, "rowTitle"))
        arch = model.architecture
        details = f"{SOURCE_TEXT[model.source]}   ·   {human_bytes(model.size_bytes)}   ·   " \
                  f"{arch.num_layers} layers, hidden {arch.hidden_size}"
        if arch.vision is not None:
            details += "   ·   vision weights"
        text.addWidget(label(details, "muted"))
        self.runs_as = label(runs_as, "facts", wrap=True)
        text.addWidget(self.runs_as)
        self.problem = label(f"Cannot load: {model.problem}", "rowProblem", wrap=True, selectable=True)
        self.problem.setVisible(bool(model.problem))
        self.runs_as.setVisible(not model.problem)
        text.addWidget(self.problem)
        text.addWidget(ElidedLabel(model.path, "path", Qt.TextElideMode.ElideMiddle))
        row.addLayout(text, 1)
        self.engine_state = Phase.UNLOADED  # LOADING or LOADED: this model in the engine
        self.load = text_button("Load", "play", "primary")
        self.load.clicked.connect(self._clicked)
        self.load.setVisible(not model.problem)
        row.addWidget(self.load)
        self.redownload = text_button("Download again", "download", "primary")
        self.redownload.setToolTip("Delete the damaged files and download this model again")
        self.redownload.clicked.connect(lambda: self.redownload_requested.emit(model))
        self.redownload.setVisible(bool(model.problem) and model.deletable)
        row.addWidget(self.redownload)
        colour = icons.DANGER if model.problem else icons.MUTED
        self.delete = icon_button("trash", "Delete this model from disk", colour)
        self.delete.clicked.connect(lambda: self.delete_requested.emit(model))
        keep_place = self.delete.sizePolicy()
        keep_place.setRetainSizeWhenHidden(True)              # Load buttons line up down the list
        self.delete.setSizePolicy(keep_place)
        self.delete.setVisible(model.deletable)
        row.addWidget(self.delete)

    def set_runs_as(self, runs_as: str) -> None:
        self.runs_as.setText(runs_as)

    def show_load_state(self, state: LoadState) -> None:
        """Load; Cancel while this model loads; Eject once it is loaded."""
        self.engine_state = state.phase_of(self.model.path)
        self.load.setText({Phase.LOADING: "Cancel", Phase.LOADED: "Eject"}.get(self.engine_state, "Load"))
        self.load.setIcon(icons.icon("play" if self.engine_state is Phase.UNLOADED else "close", icons.ON_ACCENT))
        self.load.setToolTip({Phase.LOADING: "Stop loading this model", Phase.LOADED: "Unload this model and free its "
                              "memory"}.get(self.engine_state, ""))
        set_enabled(self.delete, self.engine_state is Phase.UNLOADED, "Eject the model before deleting it"
                    if self.engine_state is Phase.LOADED else "Cancel loading the model before deleting it",
                    "Delete this model from disk")

    def _clicked(self) -> None:
        if self.engine_state is Phase.LOADING:
            self.cancel_load_requested.emit()
        elif self.engine_state is Phase.LOADED:
            self.eject_requested.emit()
        else:
            self.load_requested.emit(self.model.path)
