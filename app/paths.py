"""Where the app keeps its files.

QWENDESK_DATA_DIR overrides platformdirs' per-user data directory (tests point it at a temporary
folder); everything the app writes lives below it.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "qwendesk"


def data_dir() -> Path:
    path = Path(os.environ.get("QWENDESK_DATA_DIR") or platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_path() -> Path:
    return data_dir() / "qwendesk.sqlite3"


def models_dir() -> Path:
    """Downloaded checkpoints: models/<org>/<name>/."""
    return data_dir() / "models"


def attachments_dir() -> Path:
    path = data_dir() / "attachments"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resources_dir() -> Path:
    """The repository's resources/ folder (style sheet, icons, catalog, profiles)."""
    return Path(__file__).resolve().parent.parent / "resources"
