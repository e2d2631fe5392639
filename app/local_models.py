"""Checkpoints on this computer: the app's downloads, the Hugging Face cache and folders the
user added. A checkpoint is a directory with safetensors and a config.json the engine supports; one whose
files are incomplete or damaged is listed with the reason, so it can be deleted or downloaded again."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from engine.api import CheckpointError, ModelConfig, check_checkpoint, load_model_config

DOWNLOAD_MARKER = ".qwendesk-download.json"   # written by the download manager when verified


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: str
    source: str          # downloads | hf-cache | folder
    size_bytes: int
    architecture: ModelConfig
    problem: str = ""    # why its files cannot load (missing, truncated, unreadable); "" when whole

    @property
    def deletable(self) -> bool:
        """Only checkpoints this app downloaded are deleted from here."""
        return self.source in ("downloads", "hf-cache")


def checkpoint_config(path: Path) -> ModelConfig | None:
    """The architecture of a checkpoint the engine supports, else None."""
    try:
        return load_model_config(path)
    except (OSError, ValueError):          # no or broken config.json, an unsupported model (UnsupportedModelError)
        return None


def folder_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size    # follows the HF cache's symlinks
            except OSError:
                pass
    return total


def _model(path: Path, name: str, source: str) -> LocalModel | None:
    architecture = checkpoint_config(path)
    if architecture is None or not any(path.glob("*.safetensors")):
        return None
    return LocalModel(name, str(path), source, folder_size(path), architecture, checkpoint_problem(path))


def checkpoint_problem(path: Path) -> str:
    """Why the checkpoint's files are not whole (the engine's check of its index and headers), or ""."""
    try:
        check_checkpoint(path)
    except CheckpointError as e:
        return str(e)
    return ""


def scan_downloads(models_dir: Path) -> list[LocalModel]:
    found = []
    for marker in sorted(models_dir.glob(f"*/*/{DOWNLOAD_MARKER}")):
        path = marker.parent
        model = _model(path, f"{path.parent.name}/{path.name}", "downloads")
        if model:
            found.append(model)
    return found


def scan_hf_cache(cache_dir: Path | None = None) -> list[LocalModel]:
    """`cache_dir`: None for huggingface_hub's default (HF_HUB_CACHE)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir(cache_dir)
    except (CacheNotFound, OSError):
        return []
    found = []
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)[:1]:
            model = _model(Path(revision.snapshot_path), repo.repo_id, "hf-cache")
            if model:
                found.append(model)
    return found


def scan_folder(folder: Path) -> list[LocalModel]:
    """The folder itself if it is a checkpoint, else its direct subfolders that are."""
    if not folder.is_dir():
        return []
    own = _model(folder, folder.name, "folder")
    if own:
        return [own]
    return [m for sub in sorted(folder.iterdir()) if sub.is_dir() and (m := _model(sub, sub.name, "folder"))]


def scan_all(models_dir: Path, folders: list[str], hf_cache_dir: Path | None = None) -> list[LocalModel]:
    found, seen = [], set()
    for model in [*scan_downloads(models_dir), *scan_hf_cache(hf_cache_dir),
                  *(m for f in folders for m in scan_folder(Path(f)))]:
        key = os.path.realpath(model.path)
        if key not in seen:
            seen.add(key)
            found.append(model)
    return found


def delete_model(model: LocalModel, hf_cache_dir: Path | None = None) -> None:
    if model.source == "downloads":
        shutil.rmtree(model.path)
    elif model.source == "hf-cache":
        from huggingface_hub import scan_cache_dir
        cache = scan_cache_dir(hf_cache_dir)
        hashes = [rev.commit_hash for repo in cache.repos if repo.repo_id == model.name for rev in repo.revisions]
        cache.delete_revisions(*hashes).execute()
    else:
        raise ValueError("models in your own folders are not deleted by the app")
