"""AppContext: what the pages share (store, settings, folders, hub endpoint, device, catalog).

main() builds it from the user's machine; tests build one over temporary folders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.catalog import CatalogEntry, load_catalog
from app.settings import AppSettings
from app.store import Store
from engine.api import DeviceInfo, budget_for

NOTICEABLE = 256 << 20      # a change in available memory smaller than this does not re-plan every card


@dataclass
class AppContext:
    store: Store
    settings: AppSettings
    models_dir: Path
    device: DeviceInfo          # the device models run on, probed at start (before any model is loaded)
    hf_cache_dir: Path | None = None      # None: huggingface_hub's default cache
    hub_endpoint: str | None = None       # None: huggingface_hub's default (HF_ENDPOINT)
    catalog: list[CatalogEntry] = field(default_factory=load_catalog)
    probe: Callable[[], DeviceInfo] | None = None     # probes the device again (None: `device` stays as given)

    @property
    def budget_bytes(self) -> int:
        """The one memory figure every page shows and plans with: the engine's budget on this device."""
        return budget_for(self.settings.engine_config(""), self.device)

    def refresh_device(self) -> bool:
        """Probe the device again (only while no model holds memory); whether its memory changed noticeably."""
        if self.probe is None:
            return False
        old, self.device = self.device, self.probe()
        return old.kind != self.device.kind or abs(old.free_bytes - self.device.free_bytes) >= NOTICEABLE

    def save_settings(self, settings: AppSettings) -> None:
        self.settings = settings
        settings.save(self.store)
