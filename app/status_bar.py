"""The line at the bottom of the window: engine state (with load progress and Cancel) and the endpoint."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QProgressBar

from app.endpoint import EndpointStatus
from app.formatting import human_duration, human_tokens
from app.load_progress import LoadProgress
from app.load_state import LoadedModel, LoadState, Phase
from app.widgets import ElidedLabel, label, set_enabled, text_button


class StatusBar(QFrame):
    cancel_load_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("statusBar")
        row = QHBoxLayout(self)
        row.setContentsMargins(14, 4, 14, 4)
        row.setSpacing(10)
        self.dot = label("●", "statusDot")
        self.text = ElidedLabel("No model loaded", "statusText")
        self.progress = QProgressBar()
        self.progress.setObjectName("loadBar")
        self.progress.setRange(0, 0)
        self.progress.setTextVisible(False)
        self.progress.setFixedSize(160, 6)
        self.progress.hide()
        self.cancel = text_button("Cancel loading", kind="statusAction")
        self.cancel.clicked.connect(self.cancel_load_requested)
        self.cancel.hide()
        self.endpoint = label("", "statusText")
        row.addWidget(self.dot)
        row.addWidget(self.progress)
        row.addWidget(self.text, 1)
        row.addWidget(self.cancel)
        row.addWidget(self.endpoint)
        self.load: LoadProgress | None = None
        self._clock = QTimer(self)
        self._clock.setInterval(1000)
        self._clock.timeout.connect(self.refresh)
        self._set_dot("idle")

    def _set_dot(self, state: str) -> None:
        self.dot.setProperty("state", state)
        self.dot.style().unpolish(self.dot)
        self.dot.style().polish(self.dot)

    def show_load_state(self, state: LoadState) -> None:
        if state.phase is Phase.LOADING and state.progress is not None:
            self.loading(state.progress)
        elif state.phase is Phase.LOADED and state.model is not None:
            self.loaded(state.model)
        elif state.phase is Phase.FAILED:
            self.failed(state.message)
        else:
            self.idle(state.message or "No model loaded")

    def loading(self, load: LoadProgress) -> None:
        self.load = load
        self._set_dot("busy")
        self.progress.show()
        set_enabled(self.cancel, True, "", "Stop loading this model")
        self.cancel.show()
        self._clock.start()
        self.refresh()

    def cancelling(self) -> None:
        set_enabled(self.cancel, False, "Cancelling: the engine stops at its next step")
        self.text.setText(f"Cancelling the load of {self.load.name}…" if self.load else "Cancelling…")
        self._clock.stop()

    def refresh(self) -> None:
        """Show the load's progress again (a new stage or step; the clock each second)."""
        if self.load is None or not self.cancel.isEnabled():
            return
        fraction = self.load.fraction
        if fraction is None:
            self.progress.setRange(0, 0)                 # the engine gives no count for this stage
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(fraction * 1000))
        self.text.setText(self.load.text())

    def loaded(self, model: LoadedModel) -> None:
        self._stop_loading()
        self._set_dot("ready")
        device = "GPU" if model.device == "cuda" else "CPU"
        self.text.setText(f"{model.name}  ·  {device}  ·  {model.profile}  ·  {human_tokens(model.max_context)} "
                          f"context  ·  loaded in {human_duration(model.load_seconds)}")

    def failed(self, message: str) -> None:
        self._stop_loading()
        self._set_dot("error")
        self.text.setText(message.splitlines()[0])

    def idle(self, text: str = "No model loaded") -> None:
        self._stop_loading()
        self._set_dot("idle")
        self.text.setText(text)

    def _stop_loading(self) -> None:
        self.load = None
        self._clock.stop()
        self.progress.hide()
        self.cancel.hide()

    def set_endpoint(self, status: EndpointStatus, remote_label: str = "") -> None:
        if remote_label:
            self.endpoint.setText(f"Chat: remote {remote_label}")
        elif status.running:
            self.endpoint.setText(f"Endpoint  {status.base_url}")
        else:
            self.endpoint.setText("")
