"""CacheManager: which KV pages and GDN state slots each sequence holds, and prefix reuse.

Pages. A live sequence owns a page table; pages are reference-counted so that sequences with
a common prefix share its full pages (read only: a sequence writes only pages past its shared
prefix, which is always page aligned). A full page is indexed by a chained hash of every token
up to its end; when the last sequence using it finishes, it stays in the index as *cached*
(evictable, least recently used first) until its memory is needed.

Snapshots. Gated DeltaNet state is cumulative, so reusing a prefix of length b also needs the
GDN state exactly after b tokens: engine.cache.snapshots.Snapshots keeps copies of it at page boundaries
under the same chained hash, in the state slots above the live ones. A prefix hit needs both the
pages and a snapshot at the same boundary; a page leaving the index takes its snapshot with it.

Memory is promised up front: admission reserves every page a sequence can still need
(prompt + max new tokens), so a running sequence never runs out of pages.

Tiers. With a host tier (engine.cache.host.HostCache), a page or snapshot leaving the GPU is copied out to host
memory first; with a disk tier (engine.cache.disk.DiskCache), the pages and snapshots of a finished sequence are
also written to disk in the background. A lookup walks the chain through GPU -> host -> disk: the longest prefix
whose every page is in some tier and which has a snapshot in some tier at its end is the hit. Disk entries of a hit
are read into reserved host blocks by the disk tier's threads, while the engine goes on stepping: the lookup says
`loading`, and the request waits for a later lookup (a file that does not check out is a miss there, and the
lookup looks again); admission copies the host entries into fresh GPU pages and indexes them there.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from engine.cache.disk import DiskCache
from engine.cache.host import HostCache
from engine.cache.pages import CacheTensors, IdPool, PageTable
from engine.cache.snapshots import Snapshots

log = logging.getLogger("qwendesk.engine")


def chain_hashes(tokens: list[int], page_size: int, prev: bytes = b"") -> list[bytes]:
    """Hash of every full page, each covering all tokens up to that page's end."""
    out = []
    for i in range(len(tokens) // page_size):
        page = array("q", tokens[i * page_size:(i + 1) * page_size]).tobytes()
        prev = hashlib.blake2b(prev + page, digest_size=16).digest()
        out.append(prev)
    return out


@dataclass
class PrefixHit:
    pages: list[int] = field(default_factory=list)   # GPU page of each page of the prefix (-1: in the host tier)
    tokens: int = 0                 # prefix length reused (a multiple of the page size)
    snapshot: bytes | None = None   # key of the snapshot holding the GDN state after `tokens` tokens (None: no hit)
    keys: list[bytes] = field(default_factory=list, compare=False)   # chain hash of each page
    loading: bool = False           # the disk tier is still reading what the hit needs: look again later

    @property
    def on_gpu(self) -> list[int]:
        return [p for p in self.pages if p >= 0]


class CacheManager:
    def __init__(self, pools: CacheTensors, num_seq_slots: int, host: HostCache | None = None,
                 disk: DiskCache | None = None):
        """State slots: 0 .. num_seq_slots - 1 for live sequences, then snapshots, the last one scratch.
        disk: written at release and read through the host tier (so it needs one)."""
        if disk is not None and host is None:
            raise ValueError("the disk tier reads through the host tier: give a host tier too")
        self.pools = pools
        self.page_size = pools.page_size
        n = pools.num_pages
        self.free_pages = list(range(n - 1, -1, -1))
        self.refs = [0] * n
        self.page_key: dict[int, bytes] = {}                      # page -> hash it is indexed under
        self.index: dict[bytes, int] = {}                          # hash -> page
        self.cached: OrderedDict[int, None] = OrderedDict()        # indexed pages nobody uses (LRU)
        self.reserved = 0                                          # promised, not yet taken
        self.seq_slots = IdPool(num_seq_slots)
        self.scratch_slot = pools.scratch_slot
        self.host, self.disk = host, disk
        self.snapshots = Snapshots(pools, range(num_seq_slots, self.scratch_slot),
                                   on_evict=host.put_state if host is not None else None)
        self.hits = 0                                              # prefix tokens reused so far
        self._loads: list[tuple] = []                              # (Future, reserved entries): disk reads in flight
        self.reads_done = 0       # read batches kept so far: a lookup that said `loading` changes only after this does

    # ---- accounting ----------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.pools.num_pages

    def available_pages(self) -> int:
        return len(self.free_pages) + len(self.cached) - self.reserved

    def stats(self) -> dict:
        return {"kv_pages_total": self.num_pages,
                "kv_pages_used": self.num_pages - len(self.free_pages) - len(self.cached),
                "kv_pages_cached": len(self.cached),
                "state_slots_used": self.seq_slots.used,
                "snapshots_cached": len(self.snapshots),
                "prefix_hit_tokens": self.hits,
                **(self.host.stats() if self.host is not None else {}),
                **(self.disk.stats() if self.disk is not None else {})}

    # ---- prefix lookup ---------------------------------------------------------------------
    def match_prefix(self, tokens: list[int]) -> PrefixHit:
        """Longest cached prefix (pages + snapshot, in any tier), leaving at least one token to compute. What the
        hit needs from the disk tier is read into the host tier in the background: until that is done the hit is
        `loading` (look again later)."""
        self.collect_loads()
        hashes = chain_hashes(tokens[:len(tokens) - 1], self.page_size)
        limit, no_state = len(hashes), set()
        try:
            while True:
                n = 0
                while n < limit and self._has("page", hashes[n]):
                    n += 1
                end = next((i for i in range(n - 1, -1, -1)
                            if hashes[i] not in no_state and self._has("state", hashes[i])), -1)
                if end < 0:
                    return PrefixHit()
                keys = hashes[:end + 1]
                if self.host is not None:                        # hold this candidate's entries (and no others)
                    self.host.held.clear()
                    self.host.held.add(("state", keys[-1]))
                secured, state = self._from_disk(keys)
                if secured < 0:
                    return PrefixHit(loading=True)
                if secured < len(keys):
                    limit = secured            # a page could not be read: look again, short of it
                    continue
                if not state:
                    no_state.add(keys[-1])
                    continue
                return PrefixHit([self.index.get(h, -1) for h in keys], len(keys) * self.page_size, keys[-1], keys)
        finally:
            if self.host is not None:
                self.host.held.clear()

    @property
    def loading(self) -> bool:
        """Whether disk reads started by a lookup are still in flight (or done, and not yet kept)."""
        return bool(self._loads)

    def collect_loads(self) -> None:
        """Keep the entries of every finished background read."""
        for load in list(self._loads):
            future, placed = load
            if future.done():
                self._loads.remove(load)
                self.reads_done += 1
                try:
                    filled = future.result()
                except Exception:          # (read_many reports bad files itself: this is a bug, not a disk error)
                    log.exception("disk cache: a background read failed")
                    filled = [False] * len(placed)
                assert self.host is not None        # disk reads go to the host tier
                self.host.finish(placed, filled)

    def _has(self, kind: str, key: bytes) -> bool:
        if (key in self.index) if kind == "page" else (key in self.snapshots):
            return True
        return (self.host is not None and self.host.has(kind, key)) or (
            self.disk is not None and self.disk.has(kind, key))

    def _from_disk(self, keys: list[bytes]) -> tuple[int, bool]:
        """Read what the candidate hit `keys` has only on disk into the host tier, its snapshot and pages in one
        batch (the snapshot, the largest file, first: it is read beside the pages, not after them), holding the
        hit's host entries there meanwhile; only when all of it fits there (else a part would evict another, and
        the next lookup the first again). Returns how many leading pages are on the GPU or in the host tier, or fit
        there (-1: some are still being read), and whether the snapshot at keys[-1] is in a tier or fits."""
        host = self.host
        if host is None:            # no host tier (so no disk tier: EngineConfig.validate): it is all on the GPU
            return len(keys), True

        def kept(kind: str, key: bytes) -> bool:
            return (key in self.index if kind == "page" else key in self.snapshots) or host.has(kind, key)

        wanted = [(kind, key) for kind, key in [("state", keys[-1])] + [("page", k) for k in keys]
                  if not kept(kind, key)]
        if wanted and self.disk is not None:
            host.held.update(("page", k) for k in keys if host.has("page", k))
            fits = host.room(wanted)
            if fits < len(wanted):                      # the first entry without room: the hit ends before it
                kind, key = wanted[fits]
                return (len(keys), False) if kind == "state" else (keys.index(key), True)
            placed = host.reserve(wanted)               # (it waits for the stream: only when there is a read)
            if placed:
                self._loads.append((self.disk.read_many_async(placed), placed))
            if any(entry in host.loading for entry in wanted):
                return -1, False
        for i, key in enumerate(keys):
            if key in self.index:
                continue
            if not host.has("page", key):
                return i, kept("state", keys[-1])
            host.held.add(("page", key))
        return len(keys), kept("state", keys[-1])

    # ---- admission and growth ------------------------------------------------------------------
    def can_admit(self, hit: PrefixHit, total_tokens: int) -> bool:
        gpu = hit.on_gpu
        need = -(-total_tokens // self.page_size) - len(gpu)
        reusable = sum(1 for p in gpu if self.refs[p] == 0)  # cached pages we would revive
        return self.seq_slots.free > 0 and need <= self.available_pages() - reusable

    def admit(self, hit: PrefixHit, total_tokens: int) -> tuple[PageTable, int]:
        """Take the hit's pages and a state slot (with the snapshot copied in); reserve the pages for the rest of the
        sequence. The hit's pages in the host tier are copied into pages taken from that reservation (and indexed).
        Returns (pages, slot)."""
        for p in hit.on_gpu:
            self._ref(p)
        slot = self.seq_slots.take()[0]
        if hit.snapshot is not None:
            if hit.snapshot in self.snapshots:
                self.snapshots.restore(hit.snapshot, slot)
            else:
                assert self.host is not None        # a hit's snapshot is on the GPU or in the host tier
                self.host.load_state(hit.snapshot, slot)
            self.hits += hit.tokens
        self.reserved += -(-total_tokens // self.page_size) - len(hit.on_gpu)
        pages = PageTable(hit.pages)
        missing = [i for i, p in enumerate(pages) if p < 0]
        if missing:
            host = self.host
            assert host is not None                 # a hit's pages are on the GPU or in the host tier
            keys = [hit.keys[i] for i in missing]
            host.held.update(("page", k) for k in keys)         # the pages taken below spill: not over these
            try:
                for i in missing:
                    pages[i] = self._take_page()
                    self.reserved -= 1
                host.load_pages(keys, [pages[i] for i in missing])
            finally:
                host.held.clear()
            for i, key in zip(missing, keys):
                self.index[key] = pages[i]
                self.page_key[pages[i]] = key
        return pages, slot

    def grow(self, pages: PageTable, n_tokens: int) -> None:
        """Extend a page table (in place) to hold n_tokens, from the sequence's reservation."""
        while len(pages) * self.page_size < n_tokens:
            pages.append(self._take_page())
            self.reserved -= 1

    def _take_page(self) -> int:
        if not self.free_pages:
            page, _ = self.cached.popitem(last=False)      # evict the least recently used
            if self.host is not None and page in self.page_key:
                self.host.put_pages([self.page_key[page]], [page])
            self._unindex(page)                            # (its snapshot goes to the host tier there)
            return page
        page = self.free_pages.pop()
        self.refs[page] = 1
        return page

    def _ref(self, page: int) -> None:
        if self.refs[page] == 0:
            self.cached.pop(page, None)
        self.refs[page] += 1

    def _unindex(self, page: int) -> None:
        key = self.page_key.pop(page, None)
        if key is not None and self.index.get(key) == page:
            del self.index[key]
            self.snapshots.forget(key)
        self.refs[page] = 1

    # ---- indexing and release ----------------------------------------------------------------
    def index_pages(self, hashes: list[bytes], tokens: list[int], num_computed: int, pages: PageTable) -> None:
        """Extend `hashes` (in place) over the full pages computed since the last call and index those pages,
        so that other requests can share them even while this one runs (the work is the new pages': a decode step
        at 128K tokens does not walk the whole table)."""
        page = self.page_size
        full = num_computed // page
        start = len(hashes)
        if start >= full:
            return
        hashes += chain_hashes(tokens[start * page:full * page], page, prev=hashes[-1] if hashes else b"")
        for i in range(start, full):
            p = pages[i]
            if p not in self.page_key and hashes[i] not in self.index:
                self.index[hashes[i]] = p
                self.page_key[p] = hashes[i]

    def release(self, *, pages: PageTable, state_slot: int, total_tokens: int, hashes: list[bytes],
                tokens: list[int], num_computed: int, rolling_slot: int = -1) -> None:
        """A sequence is done (finished or cancelled): index its full computed pages for reuse (`hashes` is
        extended in place), drop its references, free its state slot and what is left of the reservation
        admit() made for `total_tokens`, and keep its rolling snapshot as the end-of-turn snapshot where
        its last full page is indexed. With a disk tier, what it indexed is written there too."""
        self.index_pages(hashes, tokens, num_computed, pages)
        newly_cached = []
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                if page in self.page_key:
                    newly_cached.append(page)
                else:
                    self.free_pages.append(page)
        for page in reversed(newly_cached):  # a prefix's last pages are evicted before its first
            self.cached[page] = None
        self.reserved -= -(-total_tokens // self.page_size) - len(pages)
        if state_slot >= 0:
            self.seq_slots.give([state_slot])
        last = hashes[-1] if hashes else None
        self.snapshots.promote(rolling_slot, last if last in self.index else None)
        if self.disk is not None:
            self._persist(self.disk, hashes)

    def _persist(self, disk: DiskCache, hashes: list[bytes]) -> None:
        """Queue a finished sequence's indexed pages and the snapshots along them for the disk tier (the snapshots
        first: when too much is pending, the writes skipped are the last pages')."""
        keys = [h for h in hashes if h in self.index]
        for key in keys:
            if key in self.snapshots:
                disk.write_state(self.pools, key, self.snapshots.slot(key))
        disk.write_pages(self.pools, keys, [self.index[h] for h in keys])
