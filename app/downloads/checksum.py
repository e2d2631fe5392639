"""Checksums the hub publishes: sha256 for LFS files, the git blob sha1 for the rest."""

from __future__ import annotations

import hashlib
from pathlib import Path

from app.downloads.hub import RemoteFile

READ_CHUNK = 1 << 20


class Checksum:
    """Fed the file's bytes in order; `matches()` compares with what the hub published."""

    def __init__(self, remote: RemoteFile):
        self.remote = remote
        if remote.sha256:
            self._hash = hashlib.sha256()
        else:
            self._hash = hashlib.sha1()
            self._hash.update(f"blob {remote.size}\0".encode())

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def update_from_file(self, path: Path, should_stop=lambda: False) -> None:
        with open(path, "rb") as f:
            while chunk := f.read(READ_CHUNK):
                if should_stop():
                    return
                self._hash.update(chunk)

    def matches(self) -> bool:
        expected = self.remote.sha256 or self.remote.git_sha1
        return expected is None or self._hash.hexdigest() == expected.lower()
