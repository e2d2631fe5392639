"""Wheels unpacked straight into the runtime's staging folder, as `pip install --target` lays them out (what the
runtime needs: packages on sys.path, executables with their mode), without pip's detour through a temporary folder.

Why not pip: `--target` installs into %TEMP%\\pip-target-XXXXXXXX\\lib\\python\\ first, 31 characters more than
the target, and torch's longest file (a license 167 characters deep in its dist-info) then passes Windows' 260 for
user names of 26 characters or more. Here the longest path is the staging folder's plus the wheel's own
(tests/test_firstrun.py computes it from torch's file list for a 32-character user name). Console scripts and
compiled bytecode are left out: the app imports the runtime, it runs none of its commands.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

CHUNK = 1 << 20


class BadWheel(ValueError):
    pass


def destination(name: str, data_dir: str) -> str | None:
    """Where a wheel entry goes, relative to the target; None for one left out (scripts, headers, data)."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or ".." in parts or ":" in parts[0] or "\\" in name:
        raise BadWheel(f"an entry outside the wheel: {name!r}")
    if parts[0] != data_dir:
        return name
    if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
        return "/".join(parts[2:])
    return None


def unpacked_size(wheel: Path) -> int:
    with zipfile.ZipFile(wheel) as z:
        return sum(info.file_size for info in z.infolist())


def unpack(wheel: Path, target: Path, on_bytes=lambda n: None) -> None:
    """Every file of `wheel` under `target` (its purelib and platlib .data too), with its Unix mode where it has one."""
    dist = wheel.name.split("-")
    data_dir = f"{dist[0]}-{dist[1]}.data"
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            relative = destination(info.filename, data_dir)
            if relative is None or info.is_dir():
                continue
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as source, path.open("wb") as out:
                while block := source.read(CHUNK):
                    out.write(block)
                    on_bytes(len(block))
            mode = info.external_attr >> 16
            if os.name == "posix" and mode & stat.S_IXUSR:
                path.chmod(0o755)
    for dist_info in target.glob(f"{dist[0]}-{dist[1]}.dist-info"):
        (dist_info / "INSTALLER").write_text("qwendesk\n", encoding="utf-8")


def unpack_all(wheels: list[Path], target: Path, on_progress=lambda done, total: None) -> None:
    """All `wheels` into `target` (made anew); on_progress(bytes written, bytes in all)."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    total, done = sum(unpacked_size(w) for w in wheels), 0

    def moved(n: int) -> None:
        nonlocal done
        done += n
        on_progress(done, total)

    for wheel in wheels:
        unpack(wheel, target, moved)
