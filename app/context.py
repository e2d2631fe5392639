"""AppContext: what the pages share (store, settings, folders, hub endpoint, device, catalog).

main() builds it from the user's machine; tests build one over temporary folders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.catalog import CatalogEntry, load_catalog
from app.settings import AppSettings
from app.store import Store
from engine.api import DeviceInfo


@dataclass
class AppContext:
    store: Store
    settings: AppSettings
    models_dir: Path
    device: DeviceInfo          # the device models run on, probed at start (before any model is loaded)
    hf_cache_dir: Path | None = None      # None: huggingface_hub's default cache
    hub_endpoint: str | None = None       # None: huggingface_hub's default (HF_ENDPOINT)
    catalog: list[CatalogEntry] = field(default_factory=load_catalog)

    def save_settings(self, settings: AppSettings) -> None:
        self.settings = settings
        settings.save(self.store)
