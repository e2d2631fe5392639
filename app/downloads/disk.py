"""Free disk space where a download will land."""

from __future__ import annotations

import shutil
from pathlib import Path

RESERVE_BYTES = 512 << 20      # keep this much free after a download


def free_bytes(path: Path) -> int:
    """Free space on the file system that holds `path` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free

