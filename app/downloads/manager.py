"""DownloadManager: the downloads the Models page shows, on the GUI thread.

Each download runs as a DownloadJob on its own thread; the job's reports go into a plain queue
that the manager drains on its clock (jobs never touch a Qt object). The manager adds what needs a
clock (speed, ETA, "stalled" when no byte has arrived for a while) and keeps a record per download in
the store, so a download paused (or running) when the app closes is there, with its partial files, at
the next start.
"""

from __future__ import annotations

import queue
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from app.downloads.hub import RepoListing
from app.downloads.job import CHUNK_BYTES, DownloadJob, JobCallbacks

ACTIVE = ("preparing", "downloading", "stalled", "verifying")
REPORT_MS = 100                 # how often job reports are taken in
SPEED_WINDOW_S = 6.0            # speed: bytes over at least this much time (so a pause in the data shows)


@dataclass
class DownloadStatus:
    repo_id: str
    revision: str = "main"
    state: str = "queued"      # queued preparing downloading stalled verifying paused failed cancelled ready
    message: str = ""
    done_bytes: int = 0
    total_bytes: int = 0
    commit: str = ""
    target_dir: str = ""
    speed: float = 0.0         # bytes per second
    eta_s: float | None = None
    last_byte_at: float = 0.0
    samples: deque = field(default_factory=lambda: deque(maxlen=128), repr=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 0.0

    def record(self, resume: bool) -> dict:
        return {"revision": self.revision, "commit": self.commit, "target_dir": self.target_dir,
                "total_bytes": self.total_bytes, "done_bytes": self.done_bytes, "message": self.message,
                "state": "resume" if resume else self.state}


class DownloadManager(QObject):
    changed = Signal(str)              # repo id: state or progress changed
    completed = Signal(str, str)       # repo id, checkpoint directory

    def __init__(self, store, models_dir: Path, *, endpoint: str | None = None,
                 token: Callable[[], str] = lambda: "", stall_after_s: float = 10.0,
                 chunk_size: int = CHUNK_BYTES, timeout: float = 20.0, autostart: bool = True, parent=None):
        super().__init__(parent)
        self.store, self.models_dir, self.endpoint, self.token = store, Path(models_dir), endpoint, token
        self.stall_after_s, self.chunk_size, self.timeout = stall_after_s, chunk_size, timeout
        self._statuses: dict[str, DownloadStatus] = {}
        self._jobs: dict[str, DownloadJob] = {}
        self._reports: queue.SimpleQueue = queue.SimpleQueue()     # (kind, repo id, *values) from jobs
        self._clock = QTimer(self)
        self._clock.setInterval(REPORT_MS)
        self._clock.timeout.connect(self._tick)
        self._clock.start()
        self._restore(autostart)

    # ---- queries -----------------------------------------------------------------------------
    def statuses(self) -> list[DownloadStatus]:
        return list(self._statuses.values())

    def status(self, repo_id: str) -> DownloadStatus | None:
        return self._statuses.get(repo_id)

    def target_dir(self, repo_id: str) -> Path:
        return self.models_dir.joinpath(*repo_id.split("/"))

    # ---- commands ----------------------------------------------------------------------------
    def start(self, repo_id: str, revision: str = "main") -> None:
        status = self._statuses.get(repo_id)
        if status and (status.active or repo_id in self._jobs):
            return
        status = status or DownloadStatus(repo_id, revision, target_dir=str(self.target_dir(repo_id)))
        status.state, status.message = "queued", ""
        self._statuses[repo_id] = status
        self._launch(status)

    def resume(self, repo_id: str) -> None:
        self.start(repo_id)

    def pause(self, repo_id: str) -> None:
        job = self._jobs.get(repo_id)
        if job:
            job.pause()
            self._set(repo_id, "pausing", "")

    def cancel(self, repo_id: str) -> None:
        """Stop and delete the partial files (a running job deletes them as it stops)."""
        job = self._jobs.get(repo_id)
        if job:
            job.cancel()
            self._set(repo_id, "cancelling", "")
        else:
            status = self._statuses.pop(repo_id, None)
            if status:
                shutil.rmtree(status.target_dir, ignore_errors=True)
            self.store.delete_download(repo_id)
            self.changed.emit(repo_id)

    def forget(self, repo_id: str) -> None:
        """Drop a finished or failed entry from the list (files stay)."""
        if repo_id not in self._jobs:
            self._statuses.pop(repo_id, None)
            self.store.delete_download(repo_id)
            self.changed.emit(repo_id)

    def shutdown(self, wait_s: float = 3.0) -> None:
        """App exit: stop the jobs and keep them marked to resume at the next start."""
        self._clock.stop()                    # no report is taken in from now on
        for repo_id, job in list(self._jobs.items()):
            self.store.save_download(repo_id, self._statuses[repo_id].record(resume=True))
            job.pause()
        deadline = time.monotonic() + wait_s
        for job in list(self._jobs.values()):
            job.thread.join(max(0.0, deadline - time.monotonic()))
        for job_id in list(self._jobs):
            self._jobs.pop(job_id)

    # ---- internals ---------------------------------------------------------------------------
    def _restore(self, autostart: bool) -> None:
        for repo_id, record in self.store.downloads().items():
            status = DownloadStatus(repo_id, record.get("revision", "main"), commit=record.get("commit", ""),
                                    target_dir=record.get("target_dir") or str(self.target_dir(repo_id)),
                                    total_bytes=record.get("total_bytes", 0), done_bytes=record.get("done_bytes", 0),
                                    message=record.get("message", ""))
            status.state = "paused" if record.get("state") in ("resume", *ACTIVE) else record.get("state", "paused")
            self._statuses[repo_id] = status
            if autostart and record.get("state") in ("resume", *ACTIVE):
                self.start(repo_id)

    def _launch(self, status: DownloadStatus) -> None:
        repo_id = status.repo_id
        reports = self._reports
        callbacks = JobCallbacks(listed=lambda listing: reports.put(("listed", repo_id, listing)),
                                 progress=lambda done: reports.put(("progress", repo_id, done)),
                                 state=lambda state, message: reports.put(("state", repo_id, state, message)))
        job = DownloadJob(repo_id, status.commit or status.revision, Path(status.target_dir), callbacks,
                          token=self.token() or None, endpoint=self.endpoint, chunk_size=self.chunk_size,
                          timeout=self.timeout)
        self._jobs[repo_id] = job
        status.samples.clear()
        status.last_byte_at = time.monotonic()
        self.store.save_download(repo_id, status.record(resume=True))
        job.start()
        self.changed.emit(repo_id)

    def _set(self, repo_id: str, state: str, message: str) -> None:
        status = self._statuses.get(repo_id)
        if status:
            status.state, status.message = state, message
            self.changed.emit(repo_id)

    def _on_listed(self, repo_id: str, listing: RepoListing) -> None:
        status = self._statuses.get(repo_id)
        if status:
            status.commit, status.total_bytes = listing.commit, listing.total_bytes
            self.store.save_download(repo_id, status.record(resume=True))

    def _on_progress(self, repo_id: str, done: int) -> None:
        status = self._statuses.get(repo_id)
        if status is None:
            return
        now = time.monotonic()
        if done > status.done_bytes:
            status.last_byte_at = now
            if status.state == "stalled":
                status.state, status.message = "downloading", ""
        elif done < status.done_bytes:
            status.samples.clear()                   # bytes thrown away (a failed checksum): measure afresh
        status.done_bytes = done

    def _on_state(self, repo_id: str, state: str, message: str) -> None:
        status = self._statuses.get(repo_id)
        if status is None:
            return
        if status.state in ("pausing", "cancelling") and state in ACTIVE:
            return                                   # the job has not seen the request yet
        status.state, status.message = state, message
        if state == "downloading":
            status.last_byte_at = time.monotonic()
        if state in ("paused", "failed", "cancelled", "ready"):
            self._jobs.pop(repo_id, None)
            status.speed, status.eta_s = 0.0, None
        if state == "cancelled":
            self._statuses.pop(repo_id, None)
            self.store.delete_download(repo_id)
        elif state == "ready":
            self.store.delete_download(repo_id)
            status.done_bytes = status.total_bytes
            self.completed.emit(repo_id, status.target_dir)
        elif state in ("paused", "failed"):
            self.store.save_download(repo_id, status.record(resume=False))
        self.changed.emit(repo_id)

    def _update_speed(self, status: DownloadStatus, now: float) -> None:
        """Bytes since the newest sample at least SPEED_WINDOW_S old (or the first), over the time since then,
        now included: steady on a fast link, falling while nothing arrives, never a stale figure."""
        samples = status.samples
        while len(samples) > 1 and now - samples[1][0] >= SPEED_WINDOW_S:
            samples.popleft()
        if samples and now - samples[0][0] >= 0.5:
            status.speed = max(0.0, (status.done_bytes - samples[0][1]) / (now - samples[0][0]))
        status.eta_s = (status.total_bytes - status.done_bytes) / status.speed if status.speed > 0 else None

    def _tick(self) -> None:
        handlers: dict[str, Callable[..., None]] = {"listed": self._on_listed, "progress": self._on_progress,
                                                    "state": self._on_state}
        progressed = set()
        while not self._reports.empty():
            kind, *args = self._reports.get()
            handlers[kind](*args)
            if kind == "progress":
                progressed.add(args[0])
        now = time.monotonic()
        for repo_id in progressed:                   # one sample and one update of the page per download and tick
            status = self._statuses.get(repo_id)
            if status is not None:
                status.samples.append((now, status.done_bytes))
                self._update_speed(status, now)
                self.changed.emit(repo_id)
        for status in self._statuses.values():
            if status.state == "downloading" and now - status.last_byte_at > self.stall_after_s:
                status.state = "stalled"
                status.message = f"No data for {int(now - status.last_byte_at)} s; waiting for the server"
                status.speed, status.eta_s = 0.0, None
                self.changed.emit(status.repo_id)
            elif status.state == "downloading" and status.samples:
                self._update_speed(status, now)
