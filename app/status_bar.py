"""The line at the bottom of the window: engine state (with load progress) and the endpoint."""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFrame, QHBoxLayout, QProgressBar

from app.endpoint import EndpointStatus
from app.engine_thread import LoadedModel
from app.formatting import human_duration, human_tokens
from app.widgets import ElidedLabel, label


class StatusBar(QFrame):
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
        self.progress.setFixedSize(120, 4)
        self.progress.hide()
        self.endpoint = label("", "statusText")
        row.addWidget(self.dot)
        row.addWidget(self.progress)
        row.addWidget(self.text, 1)
        row.addWidget(self.endpoint)
        self._loading_name, self._stage, self._started = "", "", 0.0
        self._clock = QTimer(self)
        self._clock.setInterval(1000)
        self._clock.timeout.connect(self._show_loading)
        self._set_dot("idle")

    def _set_dot(self, state: str) -> None:
        self.dot.setProperty("state", state)
        self.dot.style().unpolish(self.dot)
        self.dot.style().polish(self.dot)

    def loading(self, name: str) -> None:
        self._loading_name, self._stage, self._started = name, "Starting", time.monotonic()
        self._set_dot("busy")
        self.progress.show()
        self._clock.start()
        self._show_loading()

    def stage(self, stage: str) -> None:
        self._stage = stage
        self._show_loading()

    def _show_loading(self) -> None:
        elapsed = human_duration(time.monotonic() - self._started)
        self.text.setText(f"Loading {self._loading_name}  ·  {self._stage}  ·  {elapsed}")

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
        self._clock.stop()
        self.progress.hide()

    def set_endpoint(self, status: EndpointStatus, remote_label: str = "") -> None:
        if remote_label:
            self.endpoint.setText(f"Chat: remote {remote_label}")
        elif status.running:
            self.endpoint.setText(f"Endpoint  {status.base_url}")
        else:
            self.endpoint.setText("")
