"""The opt-in update check (Settings, packaged app): once per start, the releases feed's latest release, compared
with this version. The answer is treated as untrusted: at most 1 MiB, a tag that must read as a version, and a link
that must point at this project's releases page (else the page itself). Nothing is downloaded or installed."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

RELEASES = "https://github.com/qwendesk/qwendesk/releases"
FEED = "https://api.github.com/repos/qwendesk/qwendesk/releases/latest"
MAX_BYTES = 1 << 20
TIMEOUT_S = 10
VERSION = re.compile(r"v?(\d+(?:\.\d+){1,3})")


@dataclass(frozen=True)
class Release:
    version: str
    url: str


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def newer_release(body: bytes, current: str) -> Release | None:
    """The feed's latest release when it is newer than `current` (a published, final one); None otherwise, and for
    an answer that does not read as one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    match = VERSION.fullmatch(str(data.get("tag_name", ""))) if isinstance(data, dict) else None
    own = VERSION.fullmatch(current.split("+")[0])
    if match is None or own is None or data.get("draft") or data.get("prerelease"):
        return None
    if version_key(match.group(1)) <= version_key(own.group(1)):
        return None
    url = data.get("html_url")
    return Release(match.group(1), url if isinstance(url, str) and url.startswith(RELEASES + "/") else RELEASES)


def fetch(feed: str = FEED) -> bytes:
    request = urllib.request.Request(feed, headers={"User-Agent": "qwendesk", "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        body = response.read(MAX_BYTES + 1)
    return b"" if len(body) > MAX_BYTES else body


class UpdateCheck(QObject):
    found = Signal(object)           # a Release newer than this version (from the checking thread)

    def __init__(self, current: str, feed: str = FEED, parent=None):
        super().__init__(parent)
        self.current, self.feed = current, feed

    def start(self) -> None:
        threading.Thread(target=self._run, name="update-check", daemon=True).start()

    def _run(self) -> None:
        try:
            release = newer_release(fetch(self.feed), self.current)
        except OSError:
            return                    # offline or the feed is down: nothing to say
        if release is not None:
            self.found.emit(release)
