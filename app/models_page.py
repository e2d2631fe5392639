"""The Models page: this machine and what it should run, downloads, checkpoints on disk, the
catalog, and the Hugging Face token."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from app import dialogs, icons
from app.catalog import CatalogEntry, by_fit, fit_text, gib, recommend, runs_as, too_large
from app.context import AppContext
from app.downloads import DownloadManager
from app.downloads.hub import HubError
from app.downloads.hub_search import DEFAULT_QUERY, search_hub
from app.formatting import human_bytes
from app.load_state import LoadState, Phase
from app.local_models import DOWNLOAD_MARKER, LocalModel, delete_model, scan_all
from app.model_rows import CatalogCard, DownloadRow, LocalModelRow
from app.banners import BannerStack
from app.widgets import Card, ElidedLabel, clear_layout, label, page_header, scrolling_page, set_enabled, text_button
from engine.api import MemoryPlan, ModelConfig, check_drafter_folder, plan_for, system_share

TWO_COLUMNS_WIDTH = 900      # a narrower page lists the catalog in one column


class ModelsPage(QWidget):
    load_requested = Signal(str)              # checkpoint directory
    eject_requested = Signal()
    cancel_load_requested = Signal()
    search_finished = Signal(int, object)     # search number, SearchResult or the error's message (search thread)

    def __init__(self, context: AppContext, downloads: DownloadManager, parent=None):
        super().__init__(parent)
        self.context = context
        self.downloads = downloads
        self.local: list[LocalModel] = []
        self.load_state = LoadState()
        self.catalog_plans = {e.id: self.plan(e.id, e.architecture) for e in context.catalog}
        self.search_cards: list[CatalogCard] = []
        self.search_plans: dict[str, MemoryPlan] = {}
        self.searches = 0                         # the latest search's number: an older one's answer is dropped
        self.recommended = recommend(context.catalog, self.catalog_plans, context.device)
        self.download_rows: dict[str, DownloadRow] = {}
        self.local_rows: list[LocalModelRow] = []
        self.cards: list[CatalogCard] = []
        self.grid_columns = 2
        self.banner = BannerStack()
        self._build()
        downloads.changed.connect(self._download_changed)
        downloads.completed.connect(self._download_completed)
        self.refresh_local()
        for status in downloads.statuses():
            self._download_changed(status.repo_id)

    # ---- layout --------------------------------------------------------------------------------
    def _build(self) -> None:
        column = scrolling_page(self, 1040)
        column.addWidget(page_header("Models", "Download a Qwen3.5-family model or load one you already have."))
        column.addWidget(self.banner)
        column.addWidget(self._machine_card())

        self.downloads_title = label("Downloads", "sectionTitle")
        self.downloads_title.hide()
        self.downloads_box = QVBoxLayout()
        self.downloads_box.setSpacing(8)
        column.addWidget(self.downloads_title)
        column.addLayout(self.downloads_box)

        local_header = QHBoxLayout()
        local_header.addWidget(label("On this computer", "sectionTitle"))
        local_header.addStretch(1)
        add_folder = text_button("Add folder…", "folder")
        add_folder.clicked.connect(self.add_folder)
        refresh = text_button("Rescan", "regenerate")
        refresh.clicked.connect(self.refresh_local)
        local_header.addWidget(refresh)
        local_header.addWidget(add_folder)
        column.addLayout(local_header)
        self.folders_box = QVBoxLayout()              # the folders the user added, each with Remove
        self.folders_box.setSpacing(4)
        column.addLayout(self.folders_box)
        self.local_box = QVBoxLayout()
        self.local_box.setSpacing(8)
        self.local_empty = label("No checkpoints found yet: downloads, the Hugging Face cache and folders you add "
                                 "are searched for Qwen3.5-family models.", "emptyRow", wrap=True)
        column.addLayout(self.local_box)
        column.addWidget(self.local_empty)

        catalog_header = QHBoxLayout()
        catalog_header.addWidget(label("Catalog", "sectionTitle"))
        catalog_header.addStretch(1)
        self.fits_only = QCheckBox("Only models that fit this machine")
        self.fits_only.toggled.connect(self._place_cards)
        catalog_header.addWidget(self.fits_only)
        column.addLayout(catalog_header)
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(12)
        self.grid.setVerticalSpacing(12)
        for entry in by_fit(self.context.catalog, self.catalog_plans, self.recommended):
            plan = self.catalog_plans[entry.id]
            card = CatalogCard(entry, entry is self.recommended, runs_as(plan, self.context.device),
                               "" if plan.fits else too_large(self.context.device))
            card.download_requested.connect(self.download_checked)
            card.load_requested.connect(self.load_requested)
            card.eject_requested.connect(self.eject_requested)
            card.cancel_load_requested.connect(self.cancel_load_requested)
            self.cards.append(card)
        self.hidden_note = label("", "muted")
        column.addLayout(self.grid)
        column.addWidget(self.hidden_note)
        self._place_cards()
        column.addWidget(self._search_card())
        column.addWidget(self._token_card())
        column.addStretch(1)

    def _machine_card(self) -> Card:
        card = Card()
        row = QHBoxLayout()
        glyph = QLabel()
        glyph.setPixmap(icons.pixmap("chip", 28, icons.ACCENT))
        row.addWidget(glyph, 0, Qt.AlignmentFlag.AlignTop)
        text = QVBoxLayout()
        text.setSpacing(4)
        self.machine_title = label("", "cardTitle")
        self.machine_note = label("", "muted", wrap=True)
        self.recommendation = label("", "body", wrap=True)
        for widget in (self.machine_title, self.machine_note, self.recommendation):
            text.addWidget(widget)
        self._describe_machine()
        row.addLayout(text, 1)
        self.recommend_button = text_button("Download", "download", "primary")
        self.recommend_button.clicked.connect(self._recommended_clicked)
        row.addWidget(self.recommend_button, 0, Qt.AlignmentFlag.AlignVCenter)
        card.body.addLayout(row)
        return card

    def _describe_machine(self) -> None:
        device, budget = self.context.device, self.context.budget_bytes
        self.machine_title.setText(device.label if device.on_gpu else "No CUDA GPU found")
        memory = (f"{gib(budget)} of its memory free for models." if device.on_gpu else
                  f"{gib(budget)} of memory for models: {gib(device.free_bytes)} available now, less "
                  f"{gib(system_share(device))} kept for the rest of the system.")
        self.machine_note.setText(("Models run on this GPU: " if device.on_gpu else
                                   "Models run on the CPU: slow, and only small models are practical. ") + memory)
        entry, plan = self.recommended, self.catalog_plans[self.recommended.id]
        runs = runs_as(plan, device)
        fit = (f"that {runs[0].lower()}{runs[1:]}" if plan.fits else
               f"though {too_large(device).lower()} right now ({runs[0].lower()}{runs[1:]})")
        self.recommendation.setText(f"Recommended for this machine: <b>{entry.title}</b>, a {entry.download_gb:g} GB "
                                    f"download {fit}. {entry.summary}")

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self._columns() != self.grid_columns:
            self._place_cards()

    def _columns(self) -> int:
        return 2 if self.width() >= TWO_COLUMNS_WIDTH else 1

    def _place_cards(self) -> None:
        """Two columns in fit order (one on a narrow page); with the filter on, only the cards whose plan fits."""
        for card in self.cards:
            self.grid.removeWidget(card)
        shown = [c for c in self.cards if not (self.fits_only.isChecked() and c.too_large)]
        self.grid_columns = columns = self._columns()
        for i, card in enumerate(shown):
            self.grid.addWidget(card, i // columns, i % columns)
        for card in self.cards:
            card.setVisible(card in shown)
        hidden = len(self.cards) - len(shown)
        self.hidden_note.setText(f"{hidden} larger model{'s' if hidden != 1 else ''} hidden: "
                                 f"{too_large(self.context.device).lower()}." if hidden else "")
        self.hidden_note.setVisible(bool(hidden))

    def _search_card(self) -> Card:
        card = Card()
        card.body.addWidget(label("Search Hugging Face", "cardTitle"))
        card.body.addWidget(label("Qwen3.5-family checkpoints beyond the catalog: fine-tunes and quantized builds "
                                  "(FP8, GPTQ or AWQ int4). Each result's config.json and file sizes are read "
                                  "before anything downloads, and it shows what it would run as here.", "muted",
                                  wrap=True))
        row = QHBoxLayout()
        self.search_field = QLineEdit()
        self.search_field.setPlaceholderText(f"A name, e.g. {DEFAULT_QUERY}-9B GPTQ (empty: {DEFAULT_QUERY})")
        self.search_field.setAccessibleName("Search Hugging Face")
        self.search_field.returnPressed.connect(self.search)
        self.search_button = text_button("Search", "search")
        self.search_button.clicked.connect(self.search)
        row.addWidget(self.search_field, 1)
        row.addWidget(self.search_button)
        card.body.addLayout(row)
        self.search_status = label("", "muted", wrap=True)
        self.search_status.hide()
        card.body.addWidget(self.search_status)
        self.search_box = QVBoxLayout()
        self.search_box.setSpacing(8)
        card.body.addLayout(self.search_box)
        self.search_finished.connect(self._show_search)
        return card

    def search(self) -> None:
        """Ask the hub on a thread; the answer comes back through search_finished."""
        self.searches += 1
        number, query = self.searches, self.search_field.text()
        token, endpoint = self.context.settings.hf_token, self.context.hub_endpoint
        self.search_status.setText(f"Searching for {query.strip() or DEFAULT_QUERY}…")
        self.search_status.show()
        set_enabled(self.search_button, False, "Searching now")

        def run():
            try:
                self.search_finished.emit(number, search_hub(query, token, endpoint))
            except HubError as e:
                self.search_finished.emit(number, str(e))

        threading.Thread(target=run, name="qwendesk-hub-search", daemon=True).start()

    def _show_search(self, number: int, result) -> None:
        if number != self.searches:
            return
        set_enabled(self.search_button, True, "")
        for card in self.search_cards:
            self.search_box.removeWidget(card)
            card.deleteLater()
        self.search_cards.clear()
        if isinstance(result, str):
            self.search_status.setText(f"The search failed: {result}.")
            return
        for found in result.candidates:
            entry = CatalogEntry(id=found.repo_id, name=found.repo_id.split("/")[-1], variant=found.source_format,
                                 params="", download_gb=float(f"{found.download_bytes / 1e9:.2g}"),
                                 summary=f"{found.downloads:,} downloads · {found.likes:,} likes on Hugging Face",
                                 recommend=False, source="Hugging Face search", architecture=found.architecture)
            plan = self.search_plans[entry.id] = self.plan(entry.id, entry.architecture)
            card = CatalogCard(entry, False, runs_as(plan, self.context.device),
                               "" if plan.fits else too_large(self.context.device))
            card.download_requested.connect(self.download_checked)
            card.load_requested.connect(self.load_requested)
            card.eject_requested.connect(self.eject_requested)
            card.cancel_load_requested.connect(self.cancel_load_requested)
            self.search_cards.append(card)
            self.search_box.addWidget(card)
        skipped = len(result.left_out)
        self.search_status.setText(
            f"{len(result.candidates)} checkpoint{'s' if len(result.candidates) != 1 else ''} for “{result.query}” "
            f"that this app runs" + (f"; {skipped} other result{'s' if skipped != 1 else ''} left out (another "
                                     f"architecture or weight format: hover for why)." if skipped else "."))
        self.search_status.setToolTip("\n".join(f"{repo}: {why}" for repo, why in result.left_out.items()))
        self._refresh_cards()

    def _token_card(self) -> Card:
        card = Card()
        card.body.addWidget(label("Hugging Face token", "cardTitle"))
        card.body.addWidget(label("Only needed for gated or private repositories. Kept in this app's settings on "
                                  "this computer and never written to logs. Without one, a token saved with "
                                  "“hf auth login” is used.", "muted", wrap=True))
        row = QHBoxLayout()
        self.token = QLineEdit(self.context.settings.hf_token)
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("hf_…")
        self.token.setObjectName("tokenField")
        save = text_button("Save")
        save.clicked.connect(self.save_token)
        row.addWidget(self.token, 1)
        row.addWidget(save)
        card.body.addLayout(row)
        return card

    # ---- plans ---------------------------------------------------------------------------------
    def plan(self, model_id: str, architecture: ModelConfig) -> MemoryPlan:
        """What the engine would load a model as on this machine with the app's engine settings (the whole device:
        its memory before any model was loaded)."""
        return plan_for(self.context.settings.engine_config(model_id), self.context.device, model=architecture)

    def refresh_plans(self) -> None:
        """The engine settings changed: say again what each model runs as."""
        self.catalog_plans = {e.id: self.plan(e.id, e.architecture) for e in self.context.catalog}
        for card in self.cards:
            plan = self.catalog_plans[card.entry.id]
            card.set_runs_as(runs_as(plan, self.context.device), "" if plan.fits else too_large(self.context.device))
        order = by_fit([c.entry for c in self.cards], self.catalog_plans, self.recommended)
        self.cards.sort(key=lambda c: order.index(c.entry))
        self._place_cards()
        for row in self.local_rows:
            row.set_runs_as(fit_text(self.plan(row.model.path, row.model.architecture), self.context.device))
        for card in self.search_cards:
            plan = self.search_plans[card.entry.id] = self.plan(card.entry.id, card.entry.architecture)
            card.set_runs_as(runs_as(plan, self.context.device), "" if plan.fits else too_large(self.context.device))
        self._describe_machine()

    # ---- state ---------------------------------------------------------------------------------
    def show_load_state(self, state: LoadState) -> None:
        self.load_state = state
        for row in self.local_rows:
            row.show_load_state(state)
        self._refresh_cards()

    def refresh_local(self) -> None:
        self.local = scan_all(self.context.models_dir, self.context.settings.model_folders, self.context.hf_cache_dir)
        self._show_folders()
        for row in self.local_rows:
            self.local_box.removeWidget(row)
            row.deleteLater()
        self.local_rows = []
        for model in self.local:
            row = LocalModelRow(model, fit_text(self.plan(model.path, model.architecture), self.context.device))
            row.load_requested.connect(self.load_requested)
            row.eject_requested.connect(self.eject_requested)
            row.cancel_load_requested.connect(self.cancel_load_requested)
            row.delete_requested.connect(self.confirm_delete)
            row.redownload_requested.connect(self.confirm_redownload)
            row.show_load_state(self.load_state)
            self.local_box.addWidget(row)
            self.local_rows.append(row)
        self.local_empty.setVisible(not self.local)
        self._refresh_cards()

    def _download_completed(self, repo_id: str, _path: str) -> None:
        self.refresh_local()
        self.link_drafter(repo_id)

    def link_drafter(self, repo_id: str) -> None:
        """A catalog model or its block drafter finished downloading: when both are on disk (and the drafter is made
        for that copy of the model), it becomes the model's drafter in Settings, unless one is set there already."""
        drafters = dict(self.context.settings.drafters)
        for entry in self.context.catalog:
            if not entry.drafter or repo_id not in (entry.id, entry.drafter):
                continue
            model, drafter = self.local_path_for(entry.id), self.downloads.target_dir(entry.drafter)
            whole = (drafter / DOWNLOAD_MARKER).is_file()          # written once every file is verified
            if model and model not in drafters and whole and not check_drafter_folder(drafter, model):
                drafters[model] = str(drafter)
        if drafters != self.context.settings.drafters:
            self.context.save_settings(self.context.settings.copy(drafters=drafters))

    def local_path_for(self, repo_id: str) -> str:
        """Where a catalog model is on disk, whole (a damaged copy is offered for download again)."""
        for model in self.local:
            if model.name == repo_id and not model.problem:
                return model.path
        return ""

    def _refresh_cards(self) -> None:
        state = self.load_state
        for card in self.cards + self.search_cards:
            path = self.local_path_for(card.entry.id)
            card.set_state(path, self.downloads.status(card.entry.id),
                           state.phase_of(path))
        path = self.local_path_for(self.recommended.id)
        status = self.downloads.status(self.recommended.id)
        if path:
            loaded = path == state.path_if(Phase.LOADED)
            self.recommend_button.setText("Loaded" if loaded else "Load")
            set_enabled(self.recommend_button, not loaded, "This model is loaded: chat with it")
        else:
            busy = status is not None and status.state not in ("failed", "cancelled", "paused")
            resumable = status is not None and status.state in ("failed", "paused")
            self.recommend_button.setText("Downloading" if busy else "Resume" if resumable else "Download")
            set_enabled(self.recommend_button, not busy, "Downloading now: its progress is under Downloads")

    def _download_changed(self, repo_id: str) -> None:
        status = self.downloads.status(repo_id)
        row = self.download_rows.get(repo_id)
        if status is None:
            if row:
                self.downloads_box.removeWidget(row)
                row.deleteLater()
                del self.download_rows[repo_id]
        else:
            if row is None:
                row = DownloadRow(repo_id)
                row.pause_requested.connect(self.downloads.pause)
                row.resume_requested.connect(self.downloads.resume)
                row.cancel_requested.connect(self.confirm_cancel)
                row.forget_requested.connect(self.downloads.forget)
                self.downloads_box.addWidget(row)
                self.download_rows[repo_id] = row
            row.set_status(status)
            if status.state == "failed":
                self.banner.show_message("error", f"{repo_id}: {status.message}")
        visible = bool(self.download_rows)
        self.downloads_title.setVisible(visible)
        self._refresh_cards()

    # ---- actions -------------------------------------------------------------------------------
    def download(self, repo_id: str) -> None:
        self.banner.clear()
        self.downloads.start(repo_id)

    def download_checked(self, repo_id: str) -> None:
        """Download, after a question when the engine's plan says the model will not run here."""
        plan = self.catalog_plans.get(repo_id) or self.search_plans[repo_id]
        if not plan.fits and not dialogs.confirm(
                self, "Too large", f"{repo_id} will not run here: {plan.message}\n\nDownload it anyway (to use "
                "elsewhere or after a hardware change)?", "Download anyway"):
            return
        self.download(repo_id)
        card = next((c for c in self.cards if c.entry.id == repo_id), None)
        if card is not None and card.entry.drafter and card.with_drafter.isChecked():
            self.downloads.start(card.entry.drafter)

    def _recommended_clicked(self) -> None:
        path = self.local_path_for(self.recommended.id)
        if path:
            self.load_requested.emit(path)
        else:
            self.download(self.recommended.id)

    def add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder with checkpoints")
        if folder:
            self.add_model_folder(folder)

    def add_model_folder(self, folder: str) -> None:
        folders = self.context.settings.model_folders
        if folder not in folders:
            self.context.save_settings(self.context.settings.copy(model_folders=[*folders, folder]))
        self.refresh_local()

    def remove_model_folder(self, folder: str) -> None:
        """Stop searching a folder the user added (its files stay where they are)."""
        folders = [f for f in self.context.settings.model_folders if f != folder]
        self.context.save_settings(self.context.settings.copy(model_folders=folders))
        self.refresh_local()

    def _show_folders(self) -> None:
        clear_layout(self.folders_box)
        for folder in self.context.settings.model_folders:
            row = QWidget()
            line = QHBoxLayout(row)
            line.setContentsMargins(4, 0, 0, 0)
            shown = ElidedLabel(f"Also searched: {folder}", "path", Qt.TextElideMode.ElideMiddle)
            shown.setToolTip(folder)
            line.addWidget(shown, 1)
            remove = text_button("Remove")
            remove.setToolTip(f"Stop searching {folder} (nothing is deleted)")
            remove.setAccessibleName(f"Stop searching {folder}")
            remove.clicked.connect(lambda _=False, f=folder: self.remove_model_folder(f))
            line.addWidget(remove)
            self.folders_box.addWidget(row)

    def save_token(self) -> None:
        self.context.save_settings(self.context.settings.copy(hf_token=self.token.text().strip()))
        self.banner.show_message("info", "Token saved." if self.token.text().strip() else "Token removed.")

    def confirm_cancel(self, repo_id: str) -> None:
        """Cancelling deletes what was downloaded so far: ask first, saying how much."""
        status = self.downloads.status(repo_id)
        if status is None:
            return
        done = f" and delete the {human_bytes(status.done_bytes)} downloaded so far" if status.done_bytes else ""
        if dialogs.confirm(self, "Delete download", f"Stop downloading {repo_id}{done}? Pause keeps them to "
                           "resume later.", "Delete", keep="Keep"):
            self.downloads.cancel(repo_id)

    def confirm_redownload(self, model: LocalModel) -> None:
        """A damaged download: its files go and the hub's come again, verified."""
        if not dialogs.confirm(self, "Download again", f"Delete the damaged files of {model.name} and download it "
                               "again?", "Download again"):
            return
        if self._delete(model):
            self.download(model.name)

    def confirm_delete(self, model: LocalModel) -> None:
        if dialogs.confirm(self, "Delete model", f"Delete {model.name} from disk? This frees "
                           f"{model.size_bytes / 1e9:.1f} GB.", "Delete"):
            self._delete(model)

    def _delete(self, model: LocalModel) -> bool:
        """The model's files gone (False, with a banner saying why, when they could not be)."""
        try:
            delete_model(model, self.context.hf_cache_dir)
        except OSError as e:
            self.banner.show_message("error", f"Could not delete {model.name}: {e.strerror or e}")
            return False
        finally:
            self.refresh_local()
        return True

