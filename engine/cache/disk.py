"""DiskCache: KV pages and GDN snapshots of finished turns, kept on disk so that a restarted engine finds them.

One file per page or snapshot, `<root>/<namespace>/<kind>/<chain hash>.kv`. The namespace hashes everything that
changes what the bytes mean (the checkpoint's identity, the weights and their quantization, the activation dtype,
the pools' layout: KV dtype, page size, layer and head shapes; FORMAT_VERSION), so another model's or version's
entries are never looked at. A file is a header (magic, version, kind, key, namespace, payload size, CRC-32
of the payload) and the payload; it is written under a temporary name and renamed into place, so a write
that dies leaves no entry. A file that does not check out on reading (truncated, corrupt, foreign, another version)
is removed and counts as a miss: it is never served.

Writes never wait on the disk in the engine loop: the loop copies the bytes into the write staging (pinned host
memory on a GPU, engine/cache/staging.py; the copy queued on the stream) and a writer thread waits for that copy, then
writes; a write that does not fit in the staging now is skipped. Reads
(disk -> host tier, engine.cache.host) start when a prefix lookup needs them and run beside the loop (a request, or
Engine.warm, waits for its own; the running streams and the requests behind it do not): a hit's files, its snapshot
among its pages, are read and checked READ_THREADS at a time (an SSD serves many reads in flight, and both file
reads and zlib's CRC of large buffers run outside the GIL; one after the other they went at a quarter of the disk).
The check is a CRC-32, not a cryptographic hash: it guards against torn writes and bit rot (whoever can write the
folder can change the app too), and at ~4 GB/s a core against blake2b's ~1 it keeps up with an NVMe disk. The
folder's size is bounded: the least recently used files (by the time they were written or last read: their mtime) go
first, whatever namespace they belong to. An IO error (a full disk) is logged and the engine carries on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
import uuid
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch

from engine.cache.pages import CacheTensors
from engine.cache.staging import StagingRing

log = logging.getLogger("qwendesk.engine")

FORMAT_VERSION = 3            # 3: the k8v4 / k4v4 KV formats (rotated); 2: the CRC-32 check (1: blake2b)
CACHE_ENV = "QWENDESK_CACHE_DIR"
MAGIC = b"QDKV"
HEADER = struct.Struct("<4sIB3x16s16sQI")       # magic, version, kind, key, namespace, payload bytes, CRC-32
KINDS = {"page": 1, "state": 2}
WRITE_CHUNK_PAGES = 32
READ_THREADS = 8
# the writer's staging (pinned on a GPU): a write that does not fit is skipped (27B: a 32K turn is ~1.3 GB)
MAX_PENDING_BYTES = 2 << 30


def default_root() -> Path:
    """QWENDESK_CACHE_DIR/kv, else the user cache folder's qwendesk/kv (beside the converted weights)."""
    base = os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("qwendesk", appauthor=False)
    return Path(base) / "kv"


def namespace(identity: dict) -> bytes:
    blob = json.dumps({**identity, "format_version": FORMAT_VERSION}, sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=16).digest()


@dataclass
class WriteJob:
    kind: str
    keys: list[bytes]
    data: torch.Tensor          # [len(keys), nbytes] uint8: its piece of the staging ring
    start: int                  # where that piece starts
    ready: torch.cuda.Event | None = None   # recorded after the copy into `data` (None on the CPU)


class DiskCache:
    def __init__(self, root: str | Path, ns: bytes, budget_bytes: int, max_pending_bytes: int = MAX_PENDING_BYTES):
        self.root = Path(root)
        self.ns = ns
        self.dir = self.root / ns.hex()
        self.budget_bytes = budget_bytes
        self._staging = StagingRing(max_pending_bytes)
        self._lock = threading.Lock()
        self._files: dict[Path, tuple[float, int]] = {}          # every entry under root -> (last use, size)
        self._bytes = 0                                            # their sizes' sum
        self._keys: dict[str, set[bytes]] = {kind: set() for kind in KINDS}   # this namespace's entries
        self._queued: set[tuple[str, bytes]] = set()
        self.hit_pages = self.hit_snapshots = self.written = self.write_errors = self.skipped = 0
        self.rejected = self.evicted = 0
        self._scan()
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="qwendesk-disk-read")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="qwendesk-disk-load")   # read_many_async's batches
        self._queue: queue.Queue[WriteJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._write_loop, name="qwendesk-disk-cache", daemon=True)
        self._thread.start()

    # ---- index -------------------------------------------------------------------------------
    def _path(self, kind: str, key: bytes) -> Path:
        return self.dir / kind / f"{key.hex()}.kv"

    def _scan(self) -> None:
        """Index what is there; remove temporary files an interrupted write left."""
        if not self.root.is_dir():
            return
        for path in self.root.rglob("*"):
            try:
                if path.name.startswith(".tmp-"):
                    path.unlink(missing_ok=True)
                elif path.suffix == ".kv" and path.is_file():
                    st = path.stat()
                    self._record(path, st.st_mtime, st.st_size)
                    if path.parent.parent == self.dir and path.parent.name in KINDS:
                        self._keys[path.parent.name].add(bytes.fromhex(path.stem))
            except (OSError, ValueError):
                continue

    def _record(self, path: Path, used: float, size: int) -> None:
        """(under the lock, or before the writer starts)"""
        self._bytes += size - self._files.get(path, (0, 0))[1]
        self._files[path] = (used, size)

    def has(self, kind: str, key: bytes) -> bool:
        with self._lock:
            return key in self._keys[kind]

    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def stats(self) -> dict:
        with self._lock:
            return {"disk_pages": len(self._keys["page"]), "disk_snapshots": len(self._keys["state"]),
                    "disk_bytes": self._bytes, "disk_budget_bytes": self.budget_bytes,
                    "disk_staging_bytes": self._staging.capacity,
                    "disk_hit_pages": self.hit_pages, "disk_hit_snapshots": self.hit_snapshots,
                    "disk_written": self.written, "disk_write_errors": self.write_errors,
                    "disk_write_skipped": self.skipped, "disk_rejected": self.rejected, "disk_evicted": self.evicted}

    def _forget(self, path: Path, kind: str | None = None, key: bytes | None = None) -> None:
        with self._lock:
            self._bytes -= self._files.pop(path, (0, 0))[1]
            if kind is not None:
                self._keys[kind].discard(key)

    # ---- reading (the engine loop) ---------------------------------------------------------------
    def read_into(self, kind: str, key: bytes, views: list[torch.Tensor]) -> bool:
        """Fill `views` (1-D uint8 CPU tensors: the entry's bytes in order) from the file at (kind, key). A file that
        does not check out is removed: False, as for a missing one."""
        return self.read_many([(kind, key, views)])[0]

    def read_many(self, entries: list[tuple[str, bytes, list[torch.Tensor]]]) -> list[bool]:
        """read_into for each (kind, key, views), READ_THREADS files at a time, in the order given."""
        reads = (self._readers.map(lambda e: self._read_file(*e), entries) if len(entries) > 1
                 else [self._read_file(*e) for e in entries])
        done = []
        for (kind, key, views), error in zip(entries, reads):
            path = self._path(kind, key)
            if error is not None:
                if not isinstance(error, FileNotFoundError):
                    log.warning("disk cache: removing %s: %s", path, error)
                    self.rejected += 1
                    path.unlink(missing_ok=True)
                self._forget(path, kind, key)
                done.append(False)
                continue
            with self._lock:
                self._record(path, time.time(), HEADER.size + sum(v.numel() for v in views))
            if kind == "page":
                self.hit_pages += 1
            else:
                self.hit_snapshots += 1
            done.append(True)
        return done

    def read_many_async(self, entries: list[tuple[str, bytes, list[torch.Tensor]]]) -> Future:
        """read_many in the background (one batch at a time): a Future of its list."""
        return self._loader.submit(self.read_many, entries)

    def _read_file(self, kind: str, key: bytes, views: list[torch.Tensor]) -> Exception | None:
        """(a reader thread) The file's payload into views, checked; its mtime set to now (the LRU order). Returns
        what went wrong, if anything."""
        path = self._path(kind, key)
        nbytes = sum(v.numel() for v in views)
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER.size)
                if len(head) != HEADER.size:
                    raise ValueError("truncated header")
                magic, version, kind_id, file_key, file_ns, size, checksum = HEADER.unpack(head)
                if (magic, version, kind_id, file_key, file_ns, size) != (MAGIC, FORMAT_VERSION, KINDS[kind], key,
                                                                          self.ns, nbytes):
                    raise ValueError("a foreign or other-version entry")
                crc = 0
                for view in views:
                    buf = memoryview(view.numpy())
                    if f.readinto(buf) != len(buf):
                        raise ValueError("truncated payload")
                    crc = zlib.crc32(buf, crc)
                if f.read(1):
                    raise ValueError("trailing bytes")
                if crc != checksum:
                    raise ValueError("checksum mismatch")
        except (OSError, ValueError) as e:
            return e
        try:
            os.utime(path)
        except OSError:
            pass
        return None

    # ---- writing (queued by the engine loop, done by the writer thread) ------------------------------
    def write_pages(self, pools: CacheTensors, keys: list[bytes], pages: list[int]) -> None:
        """Queue GPU pages for writing under their chain hashes (those already on disk or queued are skipped)."""
        todo = [(k, p) for k, p in zip(keys, pages) if not self._known("page", k)]
        for i in range(0, len(todo), WRITE_CHUNK_PAGES):
            chunk = todo[i:i + WRITE_CHUNK_PAGES]
            self._queue_job("page", [k for k, _ in chunk], len(chunk) * pools.page_nbytes,
                            lambda c=chunk: pools.read_pages([p for _, p in c]))

    def write_state(self, pools: CacheTensors, key: bytes, slot: int) -> None:
        """Queue a GDN state slot for writing as the snapshot at `key`."""
        if not self._known("state", key):
            self._queue_job("state", [key], pools.state_nbytes, lambda: pools.read_state(slot).view(1, -1))

    def _known(self, kind: str, key: bytes) -> bool:
        with self._lock:
            return key in self._keys[kind] or (kind, key) in self._queued

    def _queue_job(self, kind: str, keys: list[bytes], n: int, read) -> None:
        """Queue `read()` (n bytes) for writing, unless that is more than may be pending: then nothing is read."""
        with self._lock:
            start = self._staging.take(n)
            if start is None:
                self.skipped += len(keys)
                return
            self._queued.update((kind, k) for k in keys)
        try:
            data = read()
            assert data.numel() == n, (data.shape, n)
            job = WriteJob(kind, keys, self._staging.view(start, data.shape, pinned=data.is_cuda), start)
            job.data.copy_(data, non_blocking=True)
            if data.is_cuda:
                job.ready = torch.cuda.Event()
                job.ready.record()
        except BaseException:
            self._release(kind, keys, start)
            raise
        self._queue.put(job)

    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if job.ready is not None:
                    job.ready.synchronize()
                for key, row in zip(job.keys, job.data):
                    self._write_file(job.kind, key, row.numpy())
                self._evict_over_budget()
            except Exception:          # never let the writer die: the engine keeps serving without it
                self.write_errors += 1
                log.exception("disk cache: writer failed")
            finally:
                if job is not None:    # done or failed, the job no longer holds its staging and keys
                    self._release(job.kind, job.keys, job.start)
                self._queue.task_done()

    def _release(self, kind: str, keys: list[bytes], start: int) -> None:
        with self._lock:
            self._staging.give_back(start)
            self._queued.difference_update((kind, k) for k in keys)

    def _write_file(self, kind: str, key: bytes, payload) -> None:
        path = self._path(kind, key)
        head = HEADER.pack(MAGIC, FORMAT_VERSION, KINDS[kind], key, self.ns, payload.nbytes, zlib.crc32(payload))
        tmp = path.parent / f".tmp-{key.hex()}-{uuid.uuid4().hex[:8]}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(memoryview(payload))
            os.replace(tmp, path)
        except OSError as e:
            self.write_errors += 1
            log.warning("disk cache: could not write %s: %s", path, e)
            tmp.unlink(missing_ok=True)
            return
        with self._lock:
            self._record(path, time.time(), HEADER.size + payload.nbytes)
            self._keys[kind].add(key)
        self.written += 1

    def _evict_over_budget(self) -> None:
        with self._lock:
            total = self._bytes
            if total <= self.budget_bytes:
                return
            oldest = sorted(self._files.items(), key=lambda item: item[1][0])
        for path, (_, size) in oldest:
            if total <= self.budget_bytes:
                break
            path.unlink(missing_ok=True)
            ours = path.parent.parent == self.dir and path.parent.name in KINDS
            self._forget(path, *((path.parent.name, bytes.fromhex(path.stem)) if ours else ()))
            self.evicted += 1
            total -= size

    def flush(self) -> None:
        """Wait until every queued write is done (tests, shutdown)."""
        self._queue.join()

    def close(self) -> None:
        """Finish the queued writes and the reads in flight (they fill host memory that is freed after this)."""
        self._queue.put(None)
        self._thread.join()
        self._loader.shutdown()
        self._readers.shutdown()
