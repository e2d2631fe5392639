"""DownloadJob: one repository's download on its own thread.

The job owns every file operation of its download: parts are written as `<file>.part`, checked
against the hub's checksum, and only then renamed into place, so a file under its final name is
always verified (a restart trusts it). Pause keeps the parts; cancel removes them. The job
reports through callbacks; it never touches Qt.
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.downloads import disk
from app.downloads.checksum import Checksum
from app.downloads.hub import (
    HubError,
    RangeReader,
    RemoteFile,
    RepoListing,
    auth_headers,
    file_url,
    list_repo,
)
from app.formatting import human_bytes
from app.local_models import DOWNLOAD_MARKER

CHUNK_BYTES = 64 << 10                   # the most one read takes (it returns what has arrived, up to this)
CHECKSUM_ATTEMPTS = 3                    # fetches of one file before a mismatch is an error
RETRY_DELAYS = (1, 2, 5, 10, 20, 30)     # seconds between attempts after a network error (then 30 s)


class _Stop(Exception):
    pass


class _Failed(Exception):
    pass


class _RetryableHTTP(Exception):
    pass


@dataclass
class JobCallbacks:
    listed: Callable[[RepoListing], None]
    progress: Callable[[int], None]             # bytes on disk for this download
    state: Callable[[str, str], None]           # state, message


class DownloadJob:
    def __init__(self, repo_id: str, revision: str, target_dir: Path, callbacks: JobCallbacks, *,
                 token: str | None = None, endpoint: str | None = None, chunk_size: int = CHUNK_BYTES,
                 timeout: float = 20.0, retry_delays=RETRY_DELAYS):
        self.repo_id, self.revision, self.target_dir = repo_id, revision, Path(target_dir)
        self.callbacks = callbacks
        self.token, self.endpoint = token, endpoint
        self.chunk_size, self.timeout, self.retry_delays = chunk_size, timeout, retry_delays
        self._stop_reason: str | None = None      # "pause" | "cancel"
        self._wake = threading.Event()
        self._reader: RangeReader | None = None
        self._done = 0
        self.thread = threading.Thread(target=self._run, name=f"download {repo_id}", daemon=True)

    # ---- control (any thread) --------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def pause(self) -> None:
        self._stop("pause")

    def cancel(self) -> None:
        self._stop("cancel")

    def _stop(self, reason: str) -> None:
        if self._stop_reason != "cancel":
            self._stop_reason = reason
        self._wake.set()
        reader = self._reader
        if reader:
            reader.abort()

    # ---- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.callbacks.state("preparing", "Reading the file list")
            listing = self._retrying(lambda: list_repo(self.repo_id, self.revision, self.token, self.endpoint))
            self.callbacks.listed(listing)
            self._check_disk(listing)
            self._done = sum(self._bytes_on_disk(f) for f in listing.files)
            self.callbacks.progress(self._done)
            self.callbacks.state("downloading", "")
            for remote in listing.files:
                if not self._is_done(remote):
                    self._fetch_verified(listing, remote)
            self._write_marker(listing)
            self.callbacks.state("ready", "Verified")
        except _Stop:
            if self._stop_reason == "cancel":
                shutil.rmtree(self.target_dir, ignore_errors=True)
                self.callbacks.state("cancelled", "")
            else:
                self.callbacks.state("paused", "")
        except _Failed as e:
            self.callbacks.state("failed", str(e))
        except Exception as e:  # noqa: BLE001 (a bug or an OS error still ends as a visible failure)
            self.callbacks.state("failed", f"{type(e).__name__}: {e}")

    def _check_stop(self) -> None:
        if self._stop_reason:
            raise _Stop

    def _retrying(self, attempt):
        """Run `attempt` until it succeeds; network errors wait and retry ("stalled")."""
        failures = 0
        while True:
            self._check_stop()
            try:
                return attempt()
            except HubError as e:
                if not e.retryable:
                    raise _Failed(str(e)) from None
                reason = str(e)
            except (OSError, http.client.HTTPException) as e:    # socket errors, timeouts, cut transfers
                self._check_stop()
                reason = f"connection lost ({type(e).__name__})"
            except _RetryableHTTP as e:
                reason = str(e)
            delay = self.retry_delays[min(failures, len(self.retry_delays) - 1)]
            failures += 1
            self.callbacks.state("stalled", f"{reason}; retrying in {delay} s")
            self._wake.wait(delay)
            self._check_stop()

    def _check_disk(self, listing: RepoListing) -> None:
        needed = sum(max(0, f.size - self._bytes_on_disk(f)) for f in listing.files)
        free = disk.free_bytes(self.target_dir)
        if needed + disk.RESERVE_BYTES > free:
            raise _Failed(f"Not enough free disk space: this download needs {human_bytes(needed)} more, "
                          f"{human_bytes(free)} are free on {self._volume()}")

    def _volume(self) -> str:
        path = self.target_dir
        while not path.exists() and path != path.parent:
            path = path.parent
        return str(path)

    def _final(self, remote: RemoteFile) -> Path:
        return self.target_dir / remote.path

    def _part(self, remote: RemoteFile) -> Path:
        return self.target_dir / f"{remote.path}.part"

    def _is_done(self, remote: RemoteFile) -> bool:
        final = self._final(remote)
        return final.is_file() and final.stat().st_size == remote.size

    def _bytes_on_disk(self, remote: RemoteFile) -> int:
        if self._is_done(remote):
            return remote.size
        part = self._part(remote)
        return min(part.stat().st_size, remote.size) if part.is_file() else 0

    def _fetch_verified(self, listing: RepoListing, remote: RemoteFile) -> None:
        for _ in range(CHECKSUM_ATTEMPTS):
            checksum = self._retrying(lambda: self._fetch(listing, remote))
            self.callbacks.state("downloading", "")
            if checksum.matches():
                self._part(remote).replace(self._final(remote))
                return
            self._done -= remote.size                     # the bytes were wrong: fetch them again
            self._part(remote).unlink()
            self.callbacks.progress(self._done)
            self.callbacks.state("downloading", f"{remote.path} failed its checksum; downloading it again")
        raise _Failed(f"{remote.path} does not match the hub's checksum after {CHECKSUM_ATTEMPTS} attempts")

    def _fetch(self, listing: RepoListing, remote: RemoteFile) -> Checksum:
        """Bring the part file to its full size (resuming what is there) and hash it."""
        part = self._part(remote)
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have > remote.size:
            part.unlink()
            self._done -= have - remote.size
            have = 0
        checksum = Checksum(remote)
        if have:
            self.callbacks.state("verifying", f"Checking the partial {remote.path}")
            checksum.update_from_file(part, should_stop=lambda: self._stop_reason is not None)
            self._check_stop()
            self.callbacks.state("downloading", "")
        if have == remote.size:
            return checksum
        url = file_url(listing.repo_id, remote.path, listing.commit, self.endpoint)
        reader = RangeReader(url, have, auth_headers(self.token), self.timeout)
        self._reader = reader
        try:
            if self._stop_reason:
                raise _Stop
            if reader.status == 200 and have:                 # the server ignored the range
                self._done -= have
                have = 0
                checksum = Checksum(remote)
            elif reader.status == 416:                        # the part does not fit the file: start over
                part.unlink()
                self._done -= have
                raise _RetryableHTTP(f"the server refused the range of {remote.path}")
            elif reader.status in (401, 403):
                raise _Failed(f"the hub refused {remote.path} ({reader.status}): check your token")
            elif reader.status == 404:
                raise _Failed(f"{remote.path} is missing on the hub")
            elif reader.status not in (200, 206):
                raise _RetryableHTTP(f"the hub answered {reader.status} for {remote.path}")
            with open(part, "ab" if have else "wb") as out:
                while have < remote.size:
                    chunk = reader.read(min(self.chunk_size, remote.size - have))
                    self._check_stop()
                    if not chunk:
                        raise ConnectionError("the server closed the connection")
                    out.write(chunk)
                    checksum.update(chunk)
                    have += len(chunk)
                    self._done += len(chunk)
                    self.callbacks.progress(self._done)
        finally:
            self._reader = None
            reader.close()
        return checksum

    def _write_marker(self, listing: RepoListing) -> None:
        marker = {"repo_id": listing.repo_id, "commit": listing.commit, "completed": time.time(),
                  "files": [f.as_dict() for f in listing.files]}
        (self.target_dir / DOWNLOAD_MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
