"""The runtime's wheels fetched by the app itself: resumable across Try again and restarts, each checked against
the SHA-256 the index published for it.

pip decides what to fetch (its resolver, dry-run, with a report: each wheel's URL and hash); this module fetches
them into the runtime's wheels/ folder. A file on its way is `<name>.part`; a later attempt asks the server for
the rest (an HTTP Range request) instead of starting again. Only https URLs are fetched (http on the loopback
too, for the tests), and a file is kept only when its SHA-256 matches.
"""

from __future__ import annotations

import hashlib
import http.client
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
TIMEOUT_S = 30


class DownloadError(RuntimeError):
    pass


@dataclass(frozen=True)
class Wheel:
    url: str
    sha256: str
    size: int = 0                    # bytes, from the server (0 until asked)

    @property
    def name(self) -> str:
        return urllib.parse.unquote(self.url.rsplit("/", 1)[-1].split("#", 1)[0])


def wheels_of(report: dict) -> list[Wheel]:
    """The wheels of a `pip install --dry-run --report` answer; DownloadError for one the index gave no SHA-256."""
    wheels = []
    for item in report["install"]:
        info = item["download_info"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha256:
            raise DownloadError(f"the index gave no SHA-256 for {info['url']}: not downloaded")
        wheels.append(Wheel(info["url"], sha256))
    return wheels


def allowed(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost"))


def tls_context() -> ssl.SSLContext:
    """The certificates pip ships (the frozen app's OpenSSL may not find the system's), else the system's."""
    try:
        from pip._vendor import certifi
        return ssl.create_default_context(cafile=certifi.where())
    except (ImportError, OSError):
        return ssl.create_default_context()


def open_url(url: str, method: str = "GET", headers: dict | None = None):
    if not allowed(url):
        raise DownloadError(f"refusing to download from {url} (https only)")
    request = urllib.request.Request(url, method=method, headers={"User-Agent": "qwendesk", **(headers or {})})
    return urllib.request.urlopen(request, timeout=TIMEOUT_S, context=tls_context())


def reachable(url: str, timeout: float = 8.0) -> bool:
    """Whether the index answers at all (any HTTP status counts: the network is there)."""
    try:
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "qwendesk"})
        urllib.request.urlopen(request, timeout=timeout, context=tls_context()).close()
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def with_size(wheel: Wheel) -> Wheel:
    try:
        with open_url(wheel.url, "HEAD") as response:
            return Wheel(wheel.url, wheel.sha256, int(response.headers.get("Content-Length") or 0))
    except OSError as e:
        raise DownloadError(f"{wheel.name}: {e}") from e


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def fetch(wheel: Wheel, folder: Path, on_bytes=lambda n: None, cancelled=lambda: False) -> Path:
    """The wheel in `folder`, checked. A `.part` left by an earlier attempt is continued where the server allows
    it. `on_bytes(n)` after each chunk; DownloadError when the transfer or the checksum fails."""
    final, part = folder / wheel.name, folder / f"{wheel.name}.part"
    if final.is_file():
        return final
    have = part.stat().st_size if part.is_file() else 0
    if have:
        on_bytes(have)
    try:
        with open_url(wheel.url, headers={"Range": f"bytes={have}-"} if have else None) as response:
            if have and response.status != 206:          # the server sent the whole file again
                on_bytes(-have)
                have = 0
            length = response.headers.get("Content-Length")
            expected = have + int(length) if length else None
            with part.open("ab" if have else "wb") as out:
                while block := response.read(CHUNK):
                    if cancelled():
                        raise DownloadError("Cancelled.")
                    out.write(block)
                    on_bytes(len(block))
        if expected is not None and part.stat().st_size < expected:     # the connection ended early, quietly
            raise ConnectionError(f"{part.stat().st_size} of {expected} bytes")
    except urllib.error.HTTPError as e:
        if e.code != 416 or not have:        # 416: nothing left to send, the .part is whole
            raise DownloadError(f"downloading {wheel.name}: HTTP {e.code} {e.reason}") from e
    except (OSError, http.client.HTTPException) as e:
        raise DownloadError(f"downloading {wheel.name} stopped ({e}); Try again goes on from "
                            f"{part.stat().st_size / 1e9 if part.exists() else 0:.2f} GB") from e
    if sha256_of(part) != wheel.sha256:
        part.unlink()
        raise DownloadError(f"{wheel.name} did not match its SHA-256: removed, Try again downloads it anew")
    part.rename(final)
    return final
