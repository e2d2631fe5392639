"""The Settings page: engine and profile (applied with a reload), generation defaults, the local
endpoint, and a remote OpenAI-compatible server."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QStandardItemModel
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QFileDialog,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.endpoint import EndpointSettings, EndpointStatus
from app.formatting import human_gib
from app.load_state import LoadState, Phase
from app.profile_plans import plan_profiles, profile_descriptions
from app.profile_table import ProfileTable
from app.runtime_card import RuntimeCard, runtime_folder
from app.settings import CONTEXT_POLICIES, RELOAD_FIELDS, SPECIAL_TOKENS, AppSettings
from app.server_log_view import LogView
from app.switch import Switch
from app.widgets import Card, Form, label, page_header, sampling_boxes, scrolling_page, set_enabled, text_button
from engine.api import MAX_DRAFTS, PROFILES, DeviceInfo, check_drafter_folder

WIDE, NARROW, BUTTON, GAP = 360, 130, 104, 8
WEIGHTS = (("auto", "Automatic: 16-bit when it fits, else int4"), ("bf16", "16-bit: exact, twice the memory"),
           ("int4", "int4: a quarter of the memory, fastest decode"))
# how to draft (EngineConfig.speculation; "off" is the Speculation box's Off). Not "dflash": the setting is the app's,
# the drafters are each model's, and a model without one would then not load
DRAFT_METHODS = (("auto", "Automatic: block drafter if it fits, else MTP"), ("mtp", "The model's own MTP head"))
EFFORTS = (("low", "Low: up to about 1K thinking tokens"), ("medium", "Medium: up to about 4K"),
           ("high", "High: no limit"))


class SettingsPage(QWidget):
    settings_changed = Signal(object, set)       # AppSettings, changed field names
    remote_checked = Signal(str, bool, list)     # message, ok, model ids (from the test thread)

    def __init__(self, current: Callable[[], AppSettings], device: Callable[[], DeviceInfo | None] = lambda: None,
                 parent=None):
        """`current`: the app's settings now (other pages change some fields too); `device`: the device as the app
        last probed it (the memory figure every page plans with)."""
        super().__init__(parent)
        self.probed_device = device
        self._loading = True                     # values are being put in: edits are not the user's
        self.current = current
        self.model_path = ""                     # the checkpoint plans are made for
        self._drafter_checked: tuple[tuple[str, str], str] = (("", ""), "")   # (drafter, model) -> the check's answer
        self.loaded_plan = None
        self.engine_status_text = ""
        self.descriptions = profile_descriptions()
        self._build()
        self._load_values(current())
        self.remote_checked.connect(self._show_remote_check)

    # ---- layout --------------------------------------------------------------------------------
    def _build(self) -> None:
        column = self._column = scrolling_page(self, 860)
        column.addWidget(page_header("Settings", "Engine settings apply with a reload; the rest applies at once."))
        column.addWidget(self._engine_card())
        column.addWidget(self._generation_card())
        column.addWidget(self._endpoint_card())
        column.addWidget(self._remote_card())
        self._cards_end = column.count()             # add_card puts more cards here
        runtime = runtime_folder()                   # the packaged app's downloaded PyTorch, if any
        self.runtime_card = RuntimeCard(runtime) if runtime else None
        if self.runtime_card:
            column.addWidget(self.runtime_card)
            self.runtime_card.check_updates.toggled.connect(lambda *_: self._save_immediate())
        column.addStretch(1)

    def add_card(self, card: QWidget) -> None:
        """A card another part of the app owns (Settings → Tools), after the app's own settings."""
        self._column.insertWidget(self._cards_end, card)
        self._cards_end += 1

    def _engine_card(self) -> Card:
        card = Card(spacing=12)
        card.body.addWidget(label("Engine", "cardTitle"))
        card.body.addWidget(label("Concurrency profile: how many requests decode together. Every running request "
                                  "may use the whole context, so more at once means less context each.",
                                  "muted", wrap=True))
        self.profile_group = QButtonGroup(self)
        segmented = QHBoxLayout()
        segmented.setSpacing(0)
        self.profile_buttons = {}
        for i, profile in enumerate(PROFILES):
            button = QPushButton(f"{profile}  {self.descriptions[profile]['title']}")
            button.setObjectName("segment")
            button.setProperty("position", "first" if i == 0 else "last" if i == len(PROFILES) - 1 else "middle")
            button.setCheckable(True)
            button.setCursor(Qt.CursorShape.PointingHandCursor)
            self.profile_group.addButton(button)
            self.profile_buttons[profile] = button
            segmented.addWidget(button)
        segmented.addStretch(1)
        self.profile_group.buttonToggled.connect(lambda *_: self._engine_edited())
        card.body.addLayout(segmented)
        self.profile_summary = label("", "body", wrap=True)
        card.body.addWidget(self.profile_summary)
        self.plans = ProfileTable(self.descriptions)
        card.body.addWidget(self.plans)
        form = Form()
        self.device = QComboBox()
        for value, text in (("auto", "Automatic (GPU when there is one)"), ("cuda", "GPU (CUDA)"), ("cpu", "CPU")):
            self.device.addItem(text, value)
        probed = self.probed_device()
        if probed is not None and not probed.on_gpu:      # a load on "cuda" could only fail
            model = self.device.model()
            gpu = model.item(self.device.findData("cuda")) if isinstance(model, QStandardItemModel) else None
            if gpu is not None:                 # (a combo box's own model is a QStandardItemModel)
                gpu.setText("GPU (CUDA): no CUDA GPU found")
                gpu.setEnabled(False)
        self.weights = QComboBox()
        for value, text in WEIGHTS:
            self.weights.addItem(text, value)
        self.kv_dtype = QComboBox()
        self.kv_dtype.addItem("bf16: exact", "bf16")
        self.kv_dtype.addItem("int8: half the memory, about twice the context", "int8")
        self.kv_dtype.addItem("k8v4: 8-bit keys, 4-bit values, 2.6x the context; small quality cost", "k8v4")
        self.kv_dtype.addItem("k4v4: 4-bit keys and values, 3.8x the context; a clear quality cost", "k4v4")
        self.kv_dtype.addItem("auto: the most precise that reaches the context asked (or the model's)", "auto")
        self.max_context = QSpinBox()
        self.max_context.setRange(0, 1_048_576)
        self.max_context.setSingleStep(4096)
        self.max_context.setSpecialValueText("As much as memory allows")
        self.speculation = QComboBox()
        self.speculation.addItem("Automatic: on a GPU 3 drafts (5 with a block drafter), off on the CPU", "auto")
        self.speculation.addItem("Off", 0)
        for n in range(1, MAX_DRAFTS + 1):
            self.speculation.addItem(f"Up to {n} draft token{'s' if n > 1 else ''} a step", n)
        self.speculation.setToolTip("The model drafts a few tokens and checks them in one step: the same output, "
                                    "faster. It switches itself off while it does not pay.")
        self.draft_method = QComboBox()
        for value, text in DRAFT_METHODS:
            self.draft_method.addItem(text, value)
        self.drafter_path = QLineEdit()
        self.drafter_path.setPlaceholderText("None: the model drafts with its own MTP head")
        self.drafter_path.setToolTip("A DFlash / DFlash2 block drafter made for this model (a folder with its "
                                     "config.json and safetensors): it drafts a block of tokens in one step.")
        choose = text_button("Choose…", "folder")
        choose.clicked.connect(self._choose_drafter)
        drafter_row = QHBoxLayout()
        drafter_row.addWidget(self.drafter_path, 1)
        drafter_row.addWidget(choose)
        self.drafter_note = label("", "muted", wrap=True)
        for widget in (self.device, self.weights, self.kv_dtype, self.speculation, self.draft_method,
                       self.max_context):
            widget.setFixedWidth(WIDE)
        for widget in (self.device, self.weights, self.kv_dtype, self.speculation, self.draft_method):
            widget.currentIndexChanged.connect(lambda *_: self._engine_edited())
        self.drafter_path.textChanged.connect(lambda *_: self._engine_edited())
        self.max_context.valueChanged.connect(lambda *_: self._engine_edited())
        form.addRow("Device", self.device)
        form.addRow("Weights", self.weights)
        form.addRow("KV cache", self.kv_dtype)
        form.addRow("Max context", self.max_context)
        form.addRow("Speculation", self.speculation)
        form.addRow("Draft with", self.draft_method)
        form.addRow("Block drafter", drafter_row)
        form.addRow("", self.drafter_note)
        card.body.addLayout(form)
        row = QHBoxLayout()
        self.engine_status = label("", "muted", wrap=True)
        self.apply_engine = text_button("Apply and reload", "regenerate", "primary")
        self.apply_engine.clicked.connect(self.apply_engine_settings)
        row.addWidget(self.engine_status, 1)
        row.addWidget(self.apply_engine)
        card.body.addLayout(row)
        return card

    def _generation_card(self) -> Card:
        card = Card(spacing=12)
        card.body.addWidget(label("Generation defaults", "cardTitle"))
        form = Form()
        boxes = sampling_boxes()
        self.temperature, self.top_p, self.top_k = boxes.temperature, boxes.top_p, boxes.top_k
        self.min_p, self.presence_penalty, self.max_tokens = boxes.min_p, boxes.presence_penalty, boxes.max_tokens
        self.thinking = QCheckBox("Think before answering (new chats start with this)")
        self.effort = QComboBox()
        for value, text in EFFORTS:
            self.effort.addItem(text, value)
        self.context_policy = QComboBox()
        for value, text in CONTEXT_POLICIES.items():
            self.context_policy.addItem(text, value)
        self.context_policy.setToolTip("When a conversation outgrows the model's context: leave out its oldest "
                                       "messages (the system prompt and the latest stay), or stop and ask")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("Optional instructions sent at the start of every conversation")
        self.system_prompt.setFixedHeight(80)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top P", self.top_p)
        form.addRow("Top K", self.top_k)
        form.addRow("Min P", self.min_p)
        form.addRow("Presence penalty", self.presence_penalty)
        form.addRow("Max reply tokens", self.max_tokens)
        form.addRow("Thinking", self.thinking)
        form.addRow("Reasoning effort", self.effort)
        form.addRow("When the context is full", self.context_policy)
        form.addRow("System prompt", self.system_prompt, top=True)
        card.body.addLayout(form)
        for spin in (self.temperature, self.top_p, self.top_k, self.min_p, self.presence_penalty, self.max_tokens):
            spin.setFixedWidth(NARROW)
            spin.editingFinished.connect(self._save_immediate)
        self.effort.setFixedWidth(WIDE)
        self.context_policy.setFixedWidth(WIDE)
        self.context_policy.currentIndexChanged.connect(lambda *_: self._save_immediate())
        self.thinking.toggled.connect(lambda *_: self._save_immediate())
        self.effort.currentIndexChanged.connect(lambda *_: self._save_immediate())
        self.system_prompt.textChanged.connect(self._save_immediate)
        return card

    def _endpoint_card(self) -> Card:
        card = Card(spacing=12)
        card.body.addWidget(label("Local endpoint", "cardTitle"))
        card.body.addWidget(label("Serve the loaded model to other programs on an OpenAI-compatible API.",
                                  "muted", wrap=True))
        self.endpoint_enabled = Switch("Serve the loaded model")
        self.endpoint_host = QLineEdit()
        self.endpoint_port = QSpinBox()
        self.endpoint_port.setRange(1, 65535)
        self.endpoint_key = QLineEdit()
        self.endpoint_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.endpoint_key.setPlaceholderText("Optional")
        self.endpoint_key.setToolTip("Without a key, any program that can reach the address may use the model.")
        self.special_tokens = QComboBox()
        for value, text in SPECIAL_TOKENS.items():
            self.special_tokens.addItem(text, value)
        self.special_tokens.setToolTip("What a client's message that contains <|im_start|>, <tool_call> or another "
                                       "special token's text means: as control tokens it can forge turns and tool "
                                       "results in the prompt; as plain text it is only what it says")
        generate = text_button("Generate")
        generate.clicked.connect(self._generate_key)
        key_row = QHBoxLayout()
        key_row.setSpacing(GAP)
        key_row.addWidget(self.endpoint_key)
        key_row.addWidget(generate)
        key_row.addStretch(1)
        self.base_url = label("", "mono", selectable=True)
        copy = text_button("Copy", "copy")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.base_url.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(self.base_url, 1)
        url_row.addWidget(copy)
        self.endpoint_host.setFixedWidth(WIDE)
        self.endpoint_key.setFixedWidth(WIDE - BUTTON - GAP)
        generate.setFixedWidth(BUTTON)
        self.endpoint_port.setFixedWidth(NARROW)
        self.special_tokens.setFixedWidth(WIDE)
        form = Form()
        form.addRow("", self.endpoint_enabled)
        form.addRow("Host", self.endpoint_host)
        form.addRow("Port", self.endpoint_port)
        form.addRow("API key", key_row)
        form.addRow("Special tokens", self.special_tokens)
        form.addRow("Base URL", url_row)
        card.body.addLayout(form)
        self.endpoint_status = label("", "statusLine", wrap=True)
        card.body.addWidget(self.endpoint_status)
        self.log_view = LogView()
        card.body.addWidget(self.log_view)
        self.endpoint_enabled.toggled.connect(lambda *_: self._save_immediate())
        self.endpoint_host.editingFinished.connect(self._save_immediate)
        self.endpoint_port.editingFinished.connect(self._save_immediate)
        self.endpoint_key.editingFinished.connect(self._save_immediate)
        self.special_tokens.currentIndexChanged.connect(lambda *_: self._save_immediate())
        return card

    def _remote_card(self) -> Card:
        card = Card(spacing=12)
        card.body.addWidget(label("Remote server", "cardTitle"))
        card.body.addWidget(label("Outgrown one GPU? Serve the same checkpoints with vLLM or SGLang on bigger "
                                  "machines and chat with them here.", "muted", wrap=True))
        self.remote_enabled = QCheckBox("Chat with this server instead of the local engine")
        self.remote_url = QLineEdit()
        self.remote_url.setPlaceholderText("http://gpu-box:8000/v1")
        self.remote_key = QLineEdit()
        self.remote_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.remote_key.setPlaceholderText("Optional")
        self.remote_model = QComboBox()
        self.remote_model.setEditable(True)                  # a model id may be typed
        typed = self.remote_model.lineEdit()
        if typed is not None:                                # (an editable box has one)
            typed.setPlaceholderText("First model the server lists")
            typed.editingFinished.connect(self._save_immediate)
        test = text_button("Test")
        test.setFixedWidth(BUTTON)
        self.remote_url.setFixedWidth(WIDE)
        self.remote_key.setFixedWidth(WIDE)
        self.remote_model.setFixedWidth(WIDE - BUTTON - GAP)
        test.clicked.connect(self.test_remote)
        model_row = QHBoxLayout()
        model_row.setSpacing(GAP)
        model_row.addWidget(self.remote_model)
        model_row.addWidget(test)
        model_row.addStretch(1)
        form = Form()
        form.addRow("", self.remote_enabled)
        form.addRow("Base URL", self.remote_url)
        form.addRow("API key", self.remote_key)
        form.addRow("Model", model_row)
        card.body.addLayout(form)
        self.remote_status = label("", "statusLine", wrap=True)
        card.body.addWidget(self.remote_status)
        self.remote_enabled.toggled.connect(lambda *_: self._save_immediate())
        self.remote_url.editingFinished.connect(self._save_immediate)
        self.remote_key.editingFinished.connect(self._save_immediate)
        self.remote_model.activated.connect(lambda *_: self._save_immediate())
        return card

    # ---- values --------------------------------------------------------------------------------
    def _load_values(self, s: AppSettings) -> None:
        self._loading = True
        self.profile_buttons[s.profile].setChecked(True)
        self.device.setCurrentIndex(self.device.findData(s.device))
        self.weights.setCurrentIndex(self.weights.findData(s.weights))
        self.kv_dtype.setCurrentIndex(self.kv_dtype.findData(s.kv_dtype))
        self.max_context.setValue(s.max_context or 0)
        self.speculation.setCurrentIndex(self.speculation.findData(
            "auto" if s.speculative_tokens is None else s.speculative_tokens))
        self.draft_method.setCurrentIndex(max(0, self.draft_method.findData(s.speculation)))
        self.drafter_path.setText(s.drafters.get(self.model_path, ""))
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.min_p.setValue(s.min_p)
        self.presence_penalty.setValue(s.presence_penalty)
        self.max_tokens.setValue(s.max_tokens)
        self.thinking.setChecked(s.thinking)
        self.effort.setCurrentIndex(self.effort.findData(s.reasoning_effort))
        self.context_policy.setCurrentIndex(self.context_policy.findData(s.context_policy))
        self.system_prompt.setPlainText(s.system_prompt)
        self.endpoint_enabled.setChecked(s.endpoint_enabled)
        self.endpoint_host.setText(s.endpoint_host)
        self.endpoint_port.setValue(s.endpoint_port)
        self.endpoint_key.setText(s.endpoint_api_key)
        self.special_tokens.setCurrentIndex(max(0, self.special_tokens.findData(s.endpoint_special_tokens)))
        self.remote_enabled.setChecked(s.remote_enabled)
        self.remote_url.setText(s.remote_base_url)
        self.remote_key.setText(s.remote_api_key)
        self.remote_model.setEditText(s.remote_model)
        if self.runtime_card:
            self.runtime_card.check_updates.setChecked(s.check_updates)
        self._loading = False
        self._refresh_engine_section()
        self._refresh_endpoint_url()
        self.set_endpoint_status(EndpointStatus(False))

    def edited_settings(self) -> AppSettings:
        """The app's settings with the page's fields as the page shows them."""
        profile = next(p for p, b in self.profile_buttons.items() if b.isChecked())
        return self.current().copy(
            profile=profile, device=self.device.currentData(), weights=self.weights.currentData(),
            kv_dtype=self.kv_dtype.currentData(),
            max_context=self.max_context.value() or None,
            speculative_tokens=None if self.speculation.currentData() == "auto" else self.speculation.currentData(),
            speculation=self.draft_method.currentData(), drafters=self._edited_drafters(),
            temperature=round(self.temperature.value(), 2), top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value(), min_p=round(self.min_p.value(), 2),
            presence_penalty=round(self.presence_penalty.value(), 2), max_tokens=self.max_tokens.value(),
            thinking=self.thinking.isChecked(), reasoning_effort=self.effort.currentData(),
            context_policy=self.context_policy.currentData(), system_prompt=self.system_prompt.toPlainText(),
            endpoint_enabled=self.endpoint_enabled.isChecked(), endpoint_host=self.endpoint_host.text().strip(),
            endpoint_port=self.endpoint_port.value(), endpoint_api_key=self.endpoint_key.text().strip(),
            endpoint_special_tokens=self.special_tokens.currentData(),
            remote_enabled=self.remote_enabled.isChecked(), remote_base_url=self.remote_url.text().strip(),
            remote_api_key=self.remote_key.text().strip(), remote_model=self.remote_model.currentText().strip(),
            check_updates=self.runtime_card.check_updates.isChecked() if self.runtime_card else
            self.current().check_updates)

    def _drafter_problem(self) -> str:
        """Why the drafter field cannot be used for this model ("" when it can, or is empty)."""
        path = self.drafter_path.text().strip()
        if not path:
            return ""
        if not self.model_path:
            return "Load a model first: a drafter is made for one model."
        key = (path, self.model_path)
        if self._drafter_checked[0] != key:      # (asked several times a refresh: the folders are read once)
            self._drafter_checked = (key, check_drafter_folder(path, self.model_path))
        return self._drafter_checked[1]

    def _edited_drafters(self) -> dict[str, str]:
        """The drafters per model with this model's as the field shows it (one that cannot serve it is not kept)."""
        drafters = dict(self.current().drafters)
        path = self.drafter_path.text().strip()
        if self.model_path and not self._drafter_problem():
            if path:
                drafters[self.model_path] = path
            else:
                drafters.pop(self.model_path, None)
        return drafters

    def _choose_drafter(self) -> None:
        near = Path(self.model_path).parent if self.model_path else Path.home()
        start = self.drafter_path.text().strip() or str(near)
        folder = QFileDialog.getExistingDirectory(self, "The block drafter's folder", start)
        if folder:
            self.drafter_path.setText(folder)

    def _pending_engine_changes(self) -> set[str]:
        return self.edited_settings().changed_fields(self.current()) & set(RELOAD_FIELDS)

    def _generate_key(self) -> None:
        self.endpoint_key.setText(f"sk-local-{secrets.token_urlsafe(18)}")
        self._save_immediate()

    def _save_immediate(self) -> None:
        """Everything but the engine fields applies at once."""
        if self._loading:
            return
        current = self.current()
        new = self.edited_settings().copy(**{f: getattr(current, f) for f in RELOAD_FIELDS})
        changed = new.changed_fields(current)
        self._refresh_endpoint_url()
        if changed:
            self.settings_changed.emit(new, changed)

    def apply_engine_settings(self) -> None:
        changed = self._pending_engine_changes()
        if not changed:
            return
        edited = self.edited_settings()
        self.settings_changed.emit(self.current().copy(**{f: getattr(edited, f) for f in RELOAD_FIELDS}), changed)
        self._refresh_engine_section()

    def _engine_edited(self) -> None:
        if not self._loading:
            self._refresh_engine_section()

    # ---- engine plans --------------------------------------------------------------------------
    def show_load_state(self, state: LoadState) -> None:
        """The plans follow the model: the one loading or loaded, one whose load failed, or (none) the last one used."""
        if state.phase is Phase.LOADING:
            self.set_model(state.path)
        elif state.phase is Phase.LOADED and state.model is not None:
            self.set_model(state.path, state.model.plan, f"{state.name} runs with profile {state.model.profile}.")
        elif state.phase is Phase.FAILED:
            self.set_model(state.path, None, f"{state.name} could not be loaded with these settings: change them and "
                                             f"apply, or load it again.")
        else:
            last = self.current().last_model
            self.set_model(last if last and Path(last).is_dir() else "")      # plans for it, on the whole device

    def set_model(self, path: str, loaded_plan=None, state_text: str = "") -> None:
        """The checkpoint the profile plans describe (the loaded one, or the last one used)."""
        if path != self.model_path:             # each model has its own drafter (or none)
            self._loading = True
            self.drafter_path.setText(self.current().drafters.get(path, ""))
            self._loading = False
        self.model_path, self.loaded_plan = path, loaded_plan
        self.engine_status_text = state_text
        self._refresh_engine_section()

    def refresh_plans(self) -> None:
        """The machine's memory changed: plan again."""
        self._fill_plans(self.edited_settings())

    def _refresh_engine_section(self) -> None:
        problem = self._drafter_problem()
        self.drafter_note.setText(problem or ("With a block drafter set, Automatic drafts with it where it fits in "
                                              "memory, else with the model's MTP head." if
                                              self.drafter_path.text().strip() else ""))
        self.drafter_note.setObjectName("errorNote" if problem else "muted")
        self.drafter_note.style().polish(self.drafter_note)
        edited = self.edited_settings()
        self.profile_summary.setText(self.descriptions[edited.profile]["summary"])
        pending = self._pending_engine_changes()
        loaded = self.loaded_plan is not None
        set_enabled(self.apply_engine, bool(pending), "Nothing to apply: change an engine setting above first",
                    "Reload the model with these settings" if loaded else "Keep these settings for the next load")
        self.apply_engine.setText("Apply and reload" if loaded else "Apply")
        self.engine_status.setText(("Unapplied changes: the model reloads when you apply them." if loaded else
                                    "Unapplied changes: they take effect when a model loads.") if pending
                                   else self.engine_status_text)
        self._fill_plans(edited)

    def _fill_plans(self, edited: AppSettings) -> None:
        if not self.model_path:
            self.plans.show_empty("Load a model to see what each profile means for it on this machine.")
            return
        same_device = "device" not in self._pending_engine_changes()   # then the loaded plan's budget holds
        probed = self.probed_device()
        # the app's probe is the device asked for ("auto", or what auto found); another one is probed as it is asked
        # for (a GPU this machine lacks: each plan says so)
        device = probed if probed is not None and edited.device in ("auto", probed.kind) else None
        plans = plan_profiles(edited.engine_config(self.model_path), device, self.loaded_plan if same_device else None)
        budget = max((p.budget_bytes for p in plans), default=0)
        failed = next((p.message for p in plans if not p.total_bytes and p.message), "")
        self.plans.show_plans(plans, edited.profile, f"No plan: {failed}." if failed else
                              f"Planned for {Path(self.model_path).name} with {human_gib(budget)} available, "
                              f"{edited.kv_dtype} KV cache.")

    # ---- endpoint and remote -------------------------------------------------------------------
    def _refresh_endpoint_url(self) -> None:
        settings = EndpointSettings(self.endpoint_host.text().strip() or "127.0.0.1", self.endpoint_port.value())
        self.base_url.setText(settings.base_url)

    def show_endpoint_off(self) -> None:
        """The endpoint could not start: its switch goes off (the settings already say so)."""
        self.endpoint_enabled.blockSignals(True)
        self.endpoint_enabled.setChecked(False)
        self.endpoint_enabled.blockSignals(False)

    def set_endpoint_status(self, status: EndpointStatus) -> None:
        if status.running:
            text, state = f"Running at {status.base_url}", "ok"
            self.base_url.setText(status.base_url)
        elif status.message:
            text, state = status.message, "warning" if self.endpoint_enabled.isChecked() or status.failed else ""
        else:
            text, state = "Off", ""
        self.endpoint_status.setText(text)
        self.endpoint_status.setProperty("state", state)
        self.endpoint_status.style().unpolish(self.endpoint_status)
        self.endpoint_status.style().polish(self.endpoint_status)

    def test_remote(self) -> None:
        from app.remote_client import RemoteBackend, RemoteError

        url = self.remote_url.text().strip()
        if not url:
            self._show_remote_check("Enter the server's base URL first.", False, [])
            return
        backend = RemoteBackend(url, self.remote_key.text().strip())
        self.remote_status.setText("Connecting…")

        def run():
            try:
                models = backend.list_models()
                self.remote_checked.emit("Connected. Models: " + (", ".join(models) or "none listed"), True, models)
            except (RemoteError, OSError) as e:
                self.remote_checked.emit(f"Could not connect: {e}", False, [])

        threading.Thread(target=run, daemon=True).start()

    def show_remote_problem(self, error: str) -> None:
        """A request to the remote server failed after it was tested: "Connected." would not be true any more."""
        self._show_remote_check(f"The last request failed: {error}", False, [])

    def _show_remote_check(self, message: str, ok: bool, models: list) -> None:
        self.remote_status.setText(message)
        self.remote_status.setProperty("state", "ok" if ok else "warning")
        self.remote_status.style().unpolish(self.remote_status)
        self.remote_status.style().polish(self.remote_status)
        if ok and models:
            current = self.remote_model.currentText()
            self.remote_model.clear()
            self.remote_model.addItems(models)
            self.remote_model.setEditText(current or models[0])
