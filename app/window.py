"""MainWindow: navigation (Chat, Models, Settings), the pages, the status bar, and the wiring
between the pages, the engine thread, the downloads and the chat backend."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QButtonGroup,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QScrollArea,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gc_guard import collect_in_gui_thread, freeze_long_lived
from app import icons
from app.chat.chat_page import ChatPage
from app.chat.session import ChatSession
from app.context import AppContext
from app.downloads import DownloadManager
from app.endpoint import EndpointSettings, EndpointStatus
from app.engine_thread import EngineThread
from app.load_progress import LoadProgress
from app.load_state import LoadedModel, LoadState, Phase
from app.models_page import ModelsPage
from app.remote_client import RemoteBackend
from app.runtime_card import RuntimeCard
from app.settings import ENDPOINT_FIELDS, RELOAD_FIELDS, REMOTE_FIELDS, AppSettings
from app.settings_page import SettingsPage
from app.shortcuts import HELP_KEYS, ShortcutSheet, keys
from app.status_bar import StatusBar
from app.tools.tools_card import ToolsCard
from app.tools.toolbox import ToolBox
from app.wheel_guard import guard_wheel

if TYPE_CHECKING:
    from app.tray import Tray

log = logging.getLogger("qwendesk.app")
PAGES = ("chat", "models", "settings")
GEOMETRY_KEY = "window_geometry"
MIN_WIDTH, MIN_HEIGHT = 800, 560
CPU_WARNING = "No CUDA GPU found: models run on the CPU, a few tokens per second at best."   # the only place it is said
MEMORY_REFRESH_MS = 10_000      # how often the machine's memory is probed again while no model is loaded


class MainWindow(QMainWindow):
    quit_requested = Signal()

    def __init__(self, context: AppContext, autoload: bool = True):
        super().__init__()
        self._gc_timer = collect_in_gui_thread(self)
        guard_wheel()
        self.context = context
        self.setWindowTitle("Qwen Desk")
        self.setWindowIcon(icons.app_icon())
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)
        geometry = context.store.get_setting(GEOMETRY_KEY)
        if not (geometry and self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))):
            self.resize(1280, 820)
        self.tray: Tray | None = None          # main() adds one where the system has a tray
        self._quitting = False
        self._shut_down = False
        self._told_about_tray = False
        self.load_errors: list[str] = []        # the load failures shown in banners, until a load works
        self.endpoint_status = EndpointStatus(False)
        self.remote: RemoteBackend | None = None

        self.engine = EngineThread(self)
        self.downloads = DownloadManager(context.store, context.models_dir, endpoint=context.hub_endpoint,
                                         token=lambda: self.context.settings.hf_token, parent=self)
        self.session = ChatSession(context.store, lambda: self.context.settings, self)
        self.toolbox = ToolBox(parent=self)
        self.session.toolbox = self.toolbox
        self.chat = ChatPage(self.session, context.settings.thinking, lambda: [
            (m.name, m.path, m.path == self.engine.state.path_if(Phase.LOADED)) for m in self.models.local
            if not m.problem])
        self.models = ModelsPage(context, self.downloads)
        self.settings_page = SettingsPage(lambda: self.context.settings, lambda: self.context.device)
        self.settings_page.log_view.set_log(self.engine.server_log)
        self.tools_card = ToolsCard(self.toolbox)
        self.settings_page.add_card(self.tools_card)
        self.status = StatusBar()
        self._build()
        self._connect()
        for combo in HELP_KEYS:
            QShortcut(QKeySequence(combo), self, self.show_shortcuts)
        self._memory_timer = QTimer(self)
        self._memory_timer.timeout.connect(self.refresh_memory)
        self._memory_timer.start(MEMORY_REFRESH_MS)

        if context.settings.endpoint_enabled:
            self.engine.set_endpoint(self._endpoint_settings())
        self._apply_backend()
        if not context.device.on_gpu:
            self.chat.show_banner("warning", CPU_WARNING)
        last = context.settings.last_model
        if autoload and last and Path(last, "config.json").is_file():
            self.load_model(last)
            self.show_page("chat")
        elif context.settings.remote_enabled:
            self.show_page("chat")
        else:
            self.show_page("models")           # first run: pick a model
        self.settings_page.show_load_state(self.engine.state)

    # ---- layout --------------------------------------------------------------------------------
    def _build(self) -> None:
        rail = QFrame()
        rail.setObjectName("navRail")
        rail.setFixedWidth(78)
        column = QVBoxLayout(rail)
        column.setContentsMargins(8, 14, 8, 12)
        column.setSpacing(6)
        logo = QLabel()
        logo.setPixmap(icons.app_icon().pixmap(34, 34))
        column.addWidget(logo, 0, Qt.AlignmentFlag.AlignHCenter)
        column.addSpacing(14)
        self.nav = QButtonGroup(self)
        self.nav_buttons = {}
        for name, icon_name in zip(PAGES, ("chat", "models", "settings")):
            button = QToolButton()
            button.setObjectName("navButton")
            button.setText(name.capitalize())
            button.setIcon(icons.icon(icon_name, icons.MUTED, active=icons.ACCENT))
            button.setIconSize(QSize(22, 22))
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
            button.setCheckable(True)
            button.setCursor(Qt.CursorShape.PointingHandCursor)
            button.clicked.connect(lambda _=False, n=name: self.show_page(n))
            button.setToolTip(f"{name.capitalize()} ({keys(name)})")
            button.setAccessibleName(name.capitalize())
            QShortcut(QKeySequence(keys(name)), self, partial(self.show_page, name, True))
            self.nav.addButton(button)
            self.nav_buttons[name] = button
            column.addWidget(button)
        column.addStretch(1)
        self.stack = QStackedWidget()
        for page in (self.chat, self.models, self.settings_page):
            self.stack.addWidget(page)
        body = QHBoxLayout()
        body.setContentsMargins(0, 0, 0, 0)
        body.setSpacing(0)
        body.addWidget(rail)
        body.addWidget(self.stack, 1)
        central = QWidget()
        central.setObjectName("central")
        outer = QVBoxLayout(central)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        outer.addLayout(body, 1)
        outer.addWidget(self.status)
        self.setCentralWidget(central)

    def _connect(self) -> None:
        e = self.engine
        for page in (self.models, self.settings_page, self.status):
            e.state_changed.connect(page.show_load_state)
        e.state_changed.connect(self._load_state_changed)
        e.load_progress.connect(self._load_progress)
        self.status.cancel_load_requested.connect(self.cancel_load)
        self.models.cancel_load_requested.connect(self.cancel_load)
        self.models.eject_requested.connect(self.eject)
        self.chat.cancel_load_requested.connect(self.cancel_load)
        self.chat.eject_requested.connect(self.eject)
        e.warning.connect(lambda text: self.chat.show_banner("warning", text))
        e.endpoint_changed.connect(self._endpoint_changed)
        self.models.load_requested.connect(self.load_model)
        self.chat.open_models_requested.connect(lambda: self.show_page("models"))
        self.chat.manage_tools_requested.connect(self.show_tools_settings)
        self.chat.load_requested.connect(self.load_model)
        self.settings_page.settings_changed.connect(self._settings_changed)
        card = self.settings_page.runtime_card
        if card is not None:
            card.quit_requested.connect(self.quit)
            if self.context.settings.check_updates:
                self._check_for_updates(card)
        self.downloads.completed.connect(self._download_completed)

    def _check_for_updates(self, card: RuntimeCard) -> None:
        from app.main import package_version
        from app.update_check import UpdateCheck

        self.update_check = UpdateCheck(package_version(), parent=self)
        self.update_check.found.connect(card.show_release)
        self.update_check.found.connect(lambda release: self.chat.show_banner(
            "info", f"Qwen Desk {release.version} is available: Settings has the link to its release page."))
        self.update_check.start()

    # ---- navigation ----------------------------------------------------------------------------
    def show_page(self, name: str, from_keyboard: bool = False) -> None:
        """from_keyboard: the page's shortcut: the chat then puts the cursor in the message box (typing goes there)."""
        self.stack.setCurrentIndex(PAGES.index(name))
        self.nav_buttons[name].setChecked(True)
        if from_keyboard and name == "chat":
            self.chat.composer.input.setFocus()
        self.refresh_memory()

    def show_tools_settings(self) -> None:
        self.show_page("settings")
        area = self.settings_page.findChild(QScrollArea)
        if area is not None:
            area.ensureWidgetVisible(self.tools_card)

    def show_shortcuts(self) -> ShortcutSheet:
        sheet = ShortcutSheet(self)
        sheet.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        sheet.show()
        return sheet

    def refresh_memory(self) -> None:
        """Probe the machine's memory again while no model holds any (a loaded model's pages plan with the memory
        from before it loaded) and, when it changed, re-plan every page with the new figure. On each page switch
        and every few seconds."""
        if self.engine.state.idle and self.context.refresh_device():
            self.models.refresh_plans()
            self.settings_page.refresh_plans()

    @property
    def current_page(self) -> str:
        return PAGES[self.stack.currentIndex()]

    def bring_to_front(self) -> None:
        self.show()
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.raise_()
        self.activateWindow()

    # ---- the engine ----------------------------------------------------------------------------
    def load_model(self, path: str) -> None:
        if self.session.backend is self.engine:
            self.session.stop()
        self.engine.load(self.context.settings.engine_config(path))

    def _load_progress(self, load: LoadProgress) -> None:
        self.status.refresh()
        if self.remote is None:
            self.chat.set_loading(load)

    def cancel_load(self) -> None:
        if self.engine.state.phase is Phase.LOADING:
            self.engine.cancel_load()
            self.status.cancelling()

    def eject(self) -> None:
        """Unload the model: its memory goes back to the system."""
        if self.session.backend is self.engine:
            self.session.stop()
        self.engine.unload()

    def _load_state_changed(self, state: LoadState) -> None:
        """What the window does as the load state changes (the pages follow it on their own)."""
        if self._shut_down:
            return                          # a load that ended after the window closed (the store is closed)
        if self.tray:
            self.tray.set_status({Phase.LOADED: f"{state.name} loaded", Phase.LOADING: f"loading {state.name}",
                                  Phase.FAILED: "load failed"}.get(state.phase, "no model loaded"))
        if state.phase is Phase.LOADED and state.model is not None:
            self._loaded(state.model)
        elif state.phase is Phase.FAILED:
            self._load_failed(state)
        elif state.phase is Phase.UNLOADED:
            freeze_long_lived()             # the model's objects were frozen at load: let them go
            self.refresh_memory()
        self._apply_backend()
        if state.phase is Phase.LOADED and self.current_page == "models":
            self.show_page("chat")

    def _loaded(self, model: LoadedModel) -> None:
        freeze_long_lived()                 # the model's objects: out of the collector's way from now on
        self.context.save_settings(self.context.settings.copy(last_model=model.path))
        for message in self.load_errors:     # a load that works makes the earlier failures history
            self.models.banner.remove_text(message)
            self.chat.banner.remove_text(message)
        self.load_errors.clear()

    def _load_failed(self, state: LoadState) -> None:
        self.models.banner.show_message("error", state.message)
        self.chat.show_banner("error", state.message, "Models")
        self.load_errors.append(state.message)

    def _download_completed(self, repo_id: str, path: str) -> None:
        if self.engine.state.idle:
            self.load_model(path)           # the first model: ready to chat when it lands

    # ---- settings ------------------------------------------------------------------------------
    def _endpoint_settings(self) -> EndpointSettings | None:
        s = self.context.settings
        return EndpointSettings(s.endpoint_host or "127.0.0.1", s.endpoint_port, s.endpoint_api_key,
                                s.endpoint_special_tokens) \
            if s.endpoint_enabled else None

    def _settings_changed(self, settings: AppSettings, changed: set) -> None:
        self.context.save_settings(settings)
        if changed & set(RELOAD_FIELDS):
            self.models.refresh_plans()
            path = self.engine.state.path   # loading, loaded, or failed (tried again)
            if path:
                self.load_model(path)
        if changed & set(ENDPOINT_FIELDS):
            self.engine.set_endpoint(self._endpoint_settings())
        if changed & set(REMOTE_FIELDS):
            self._apply_backend()
        if "thinking" in changed:
            self.chat.composer.think_button.setChecked(settings.thinking)

    def _endpoint_changed(self, status: EndpointStatus) -> None:
        self.endpoint_status = status
        if status.failed and self.context.settings.endpoint_enabled:
            self.context.save_settings(self.context.settings.copy(endpoint_enabled=False))
            self.settings_page.show_endpoint_off()
        self.settings_page.set_endpoint_status(status)
        self.status.set_endpoint(status, self.remote.label if self.remote else "")

    def _remote_reply_finished(self, request_id: str, result) -> None:
        """A reply from the remote server that failed: Settings no longer says it is connected."""
        if result.finish_reason == "error":
            self.settings_page.show_remote_problem(result.error)

    def _apply_backend(self) -> None:
        """The chat talks to the remote server when one is set, else to the loaded model."""
        s = self.context.settings
        if s.remote_enabled and s.remote_base_url:
            if self.remote is None or (self.remote.base_url, self.remote.api_key, self.remote.model) != \
                    (s.remote_base_url.rstrip("/"), s.remote_api_key, s.remote_model):
                self.remote = RemoteBackend(s.remote_base_url, s.remote_api_key, s.remote_model, self)
                self.remote.reply_finished.connect(self._remote_reply_finished)
            self.session.set_backend(self.remote)
            self.chat.set_model(self.remote.label)
        else:
            self.remote = None
            state = self.engine.state
            if state.model is not None:
                self.session.set_backend(self.engine)
                self.chat.set_model(state.model.name)
            else:
                self.session.set_backend(None)
                if state.progress is not None:
                    self.chat.set_loading(state.progress)
                else:
                    self.chat.set_model("", "Load a model to chat")
        self.status.set_endpoint(self.endpoint_status, self.remote.label if self.remote else "")

    # ---- closing -------------------------------------------------------------------------------
    def quit(self) -> None:
        self._quitting = True
        self.close()

    def closeEvent(self, event) -> None:
        if self.tray is not None and self.endpoint_status.running and not self._quitting:
            self.hide()                      # keep serving from the tray
            if not self._told_about_tray:
                self.tray.showMessage("Qwen Desk", "Still serving the endpoint. Quit from the tray icon.")
                self._told_about_tray = True
            event.ignore()
            return
        self.shutdown()
        event.accept()
        self.quit_requested.emit()

    def shutdown(self) -> None:
        """Stop replies, downloads (they resume at the next start) and the engine."""
        self.context.store.set_setting(GEOMETRY_KEY, bytes(self.saveGeometry().toBase64().data()).decode())
        self._shut_down = True
        self.session.stop()
        self.toolbox.blockSignals(True)     # a call still running answers no one
        self.toolbox.close()                # every tool server stops: no process outlives the app
        self.downloads.shutdown()
        self.engine.blockSignals(True)      # nothing the engine thread says reaches the window any more
        if not self.engine.shutdown(3_000 if self.engine.state.phase is Phase.LOADING else 10_000):
            log.warning("the engine thread is still busy (a model is loading); leaving it behind")
        QApplication.processEvents()
