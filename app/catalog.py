"""The model catalog (resources/catalog.json) and the recommendation for a GPU."""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.paths import resources_dir

GB = 1_000_000_000


@dataclass(frozen=True)
class CatalogEntry:
    id: str              # Hugging Face repository id
    name: str
    variant: str         # FP8 | BF16
    params: str
    download_gb: float
    vram_gb: float
    loads_as: str        # int4 | bf16
    load: str            # how it loads, in words
    summary: str
    recommend: bool      # a candidate for the recommendation
    source: str          # where the repository id was confirmed

    @property
    def title(self) -> str:
        return f"{self.name} {self.variant}"

    @property
    def folder_name(self) -> str:
        return self.id.split("/")[-1]


def load_catalog() -> list[CatalogEntry]:
    data = json.loads((resources_dir() / "catalog.json").read_text(encoding="utf-8"))
    return [CatalogEntry(**entry) for entry in data["models"]]


def recommend(catalog: list[CatalogEntry], gpu_bytes: int | None) -> CatalogEntry:
    """The best recommendable model whose VRAM need fits the GPU; the smallest one without a GPU."""
    candidates = [e for e in catalog if e.recommend]
    if gpu_bytes:
        for entry in candidates:                      # the catalog lists the best first
            if entry.vram_gb * GB <= gpu_bytes:
                return entry
    return min(candidates, key=lambda e: e.vram_gb)
