"""HostCache: KV pages and GDN snapshots evicted from the GPU, kept in (pinned) host memory within a byte budget.

Storage is blocks of one page's bytes (CacheTensors.page_nbytes) in slabs; a page takes one block, a snapshot as
many as its bytes need. An entry is kept under (kind, chain hash) — kind "page" or "state" — least recently used
first; making room evicts the least recently used entry that is not held (entries a prefix hit is being restored
from are held).

Pinned slabs (pools on a GPU) are all allocated at load, on a thread of their own, and the engine waits for them
before it serves (wait_allocated): pinning takes the OS time, and while it does, CUDA calls from other threads wait
too. Measured 2026-12-08 on an H100: slabs of 128 MiB pinned as spills needed them stalled C8 rounds for 49-704 ms,
on the loop thread and then, moved to a thread of their own, at the loop's next kernel launch. Unpinned slabs (pools
on the CPU) cost nothing until touched and are allocated as they are needed, up to the budget.

Copies between the GPU and these blocks are queued on the current CUDA stream without waiting (pinned memory), so
they are ordered with the steps around them; a run of consecutive blocks moves in one copy. Only the disk tier
writes blocks from the CPU: reserve() first waits for the stream, so no queued copy still reads the blocks it hands
out, and they stay loading (not kept, not evictable) until finish(), so a reader thread may fill them meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future

import torch

from engine.cache.pages import CacheTensors

SLAB_BYTES = 128 << 20    # a slab holds as many blocks as fit here (torch's pinned allocator rounds up to a power of 2)
STAGE_PAGES = 32          # pages restored per GPU staging buffer

log = logging.getLogger(__name__)


def _in_thread(fn, *args) -> Future:
    """fn(*args) on a new daemon thread; its result (or exception) in the Future."""
    done: Future = Future()

    def work():
        try:
            done.set_result(fn(*args))
        except BaseException as e:           # handed to the reader of the Future
            done.set_exception(e)
    threading.Thread(target=work, name="host-cache-slabs", daemon=True).start()
    return done


class HostCache:
    def __init__(self, pools: CacheTensors, budget_bytes: int, at_load: bool | None = None):
        """at_load: allocate every slab of the budget now, on a thread of their own (default: when the memory is
        pinned); until they are there (wait_allocated), nothing is kept."""
        self.pools = pools
        self.block = pools.page_nbytes
        self.state_blocks = -(-pools.state_nbytes // self.block)
        self.max_blocks = budget_bytes // self.block
        self.slab_blocks = max(1, min(SLAB_BYTES // self.block, self.max_blocks))
        self.pinned = pools.k.is_cuda
        self.slabs: list[torch.Tensor] = []                                  # [slab_blocks, block] uint8
        self.free: list[int] = []
        self.entries: OrderedDict[tuple[str, bytes], list[int]] = OrderedDict()   # LRU first
        self.held: set[tuple[str, bytes]] = set()
        self.loading: dict[tuple[str, bytes], list[int]] = {}   # reserved, being filled (the disk tier's reads)
        self.counts = {"page": 0, "state": 0}          # entries by kind (stats are read every engine step)
        self.hit_pages = 0
        self.hit_snapshots = 0
        at_load = self.pinned if at_load is None else at_load
        self._allocating = _in_thread(self._allocate_budget) if at_load and self.max_blocks else None

    # ---- accounting --------------------------------------------------------------------------
    def has(self, kind: str, key: bytes) -> bool:
        return (kind, key) in self.entries

    @property
    def allocated_bytes(self) -> int:
        return sum(len(slab) for slab in self.slabs) * self.block

    def stats(self) -> dict:
        return {"host_pages": self.counts["page"], "host_snapshots": self.counts["state"],
                "host_bytes": self.allocated_bytes, "host_budget_bytes": self.max_blocks * self.block,
                "host_hit_pages": self.hit_pages, "host_hit_snapshots": self.hit_snapshots}

    # ---- blocks ------------------------------------------------------------------------------
    def _view(self, block: int) -> torch.Tensor:
        return self.slabs[block // self.slab_blocks][block % self.slab_blocks]

    def _runs(self, blocks: list[int]) -> list[tuple[int, int]]:
        """(index into blocks, length) of runs of consecutive blocks inside one slab."""
        runs, start = [], 0
        for i in range(1, len(blocks) + 1):
            if (i == len(blocks) or blocks[i] != blocks[i - 1] + 1
                    or blocks[i] // self.slab_blocks != blocks[start] // self.slab_blocks):
                runs.append((start, i - start))
                start = i
        return runs

    def _span(self, first: int, n: int) -> torch.Tensor:
        """Blocks first .. first + n - 1 (one slab) as one [n, block] tensor."""
        row = first % self.slab_blocks
        return self.slabs[first // self.slab_blocks][row:row + n]

    def _unused(self) -> int:
        """Free blocks and those the budget has not allocated yet (the last slab may be shorter)."""
        return len(self.free) + self.max_blocks - sum(len(slab) for slab in self.slabs)

    def _evictable(self, keep=frozenset()) -> int:
        """Blocks of the entries that may be evicted: not held, not in `keep`."""
        return sum(len(b) for e, b in self.entries.items() if e not in self.held and e not in keep)

    def _slab_rows(self, blocks: int) -> list[int]:
        """The rows of the next slabs that hold at least `blocks` more blocks, within the budget."""
        rows, first = [], sum(len(slab) for slab in self.slabs)
        while blocks > 0 and first < self.max_blocks:
            rows.append(min(self.slab_blocks, self.max_blocks - first))
            first += rows[-1]
            blocks -= rows[-1]
        return rows

    def _allocate(self, rows: int) -> torch.Tensor:
        return torch.empty(rows, self.block, dtype=torch.uint8, pin_memory=self.pinned)

    def _add(self, slab: torch.Tensor) -> None:
        first = len(self.slabs) * self.slab_blocks
        self.slabs.append(slab)
        self.free.extend(range(first + len(slab) - 1, first - 1, -1))

    def _allocate_budget(self) -> tuple[list[torch.Tensor], Exception | None]:
        """Every slab of the budget, in order, up to the first the OS refuses (and why)."""
        slabs: list[torch.Tensor] = []
        try:
            for rows in self._slab_rows(self.max_blocks):
                slabs.append(self._allocate(rows))
        except RuntimeError as e:
            return slabs, e
        return slabs, None

    def wait_allocated(self) -> None:
        """Wait for the slabs allocated at load (if any are still coming) and take them into use."""
        if self._allocating is None:
            return
        slabs, refused = self._allocating.result()
        self._allocating = None
        for slab in slabs:
            self._add(slab)
        if refused is not None:                         # the OS pins no more: the budget is what there is
            self.max_blocks = sum(len(slab) for slab in self.slabs)
            log.warning("host cache tier stays at %.1f GiB: %s", self.allocated_bytes / 2**30, refused)

    def _take(self, n: int) -> list[int] | None:
        """n free blocks, growing the slabs within the budget, else evicting unheld entries (None: cannot, and then
        nothing is evicted; or the slabs allocated at load are not taken into use yet: wait_allocated)."""
        if self._allocating is not None:
            return None
        unused = self._unused()
        if unused < n and unused + self._evictable() < n:
            return None
        while len(self.free) < n:
            rows = self._slab_rows(n - len(self.free))
            if rows:
                for r in rows:
                    self._add(self._allocate(r))
            elif not self._evict_one():
                return None
        return [self.free.pop() for _ in range(n)]

    def _evict_one(self) -> bool:
        for entry in self.entries:
            if entry not in self.held:
                self.discard(*entry)
                return True
        return False

    def discard(self, kind: str, key: bytes) -> None:
        blocks = self.entries.pop((kind, key), None)
        if blocks is not None:
            self.free.extend(reversed(blocks))
            self.counts[kind] -= 1

    def _put(self, kind: str, key: bytes, n_blocks: int) -> list[int] | None:
        if (kind, key) in self.entries:
            self.entries.move_to_end((kind, key))
            return None
        blocks = self._take(n_blocks)
        if blocks is not None:
            self.entries[(kind, key)] = blocks
            self.counts[kind] += 1
        return blocks

    # ---- GPU -> host -------------------------------------------------------------------------------
    def put_pages(self, keys: list[bytes], pages: list[int]) -> None:
        """Copy GPU pages out under their chain hashes (already kept ones only become most recently used)."""
        todo = [(k, p) for k, p in zip(keys, pages) if ("page", k) not in self.entries]
        for k in keys:
            if ("page", k) in self.entries:
                self.entries.move_to_end(("page", k))
        placed = []
        for k, p in todo:
            blocks = self._put("page", k, 1)
            if blocks is None:
                break
            placed.append((blocks[0], p))
            self.held.add(("page", k))          # not evicted again by this batch's later pages
        self.held.difference_update(("page", k) for k, _ in todo)
        if not placed:
            return
        placed.sort()
        data = self.pools.read_pages([p for _, p in placed])
        blocks = [b for b, _ in placed]
        for i, n in self._runs(blocks):
            self._span(blocks[i], n).copy_(data[i:i + n], non_blocking=True)

    def put_state(self, key: bytes, slot: int) -> None:
        """Copy a GDN state slot out as the snapshot at `key`."""
        blocks = self._put("state", key, self.state_blocks)
        if blocks is None:
            return
        data = self.pools.read_state(slot)
        for i, n in self._runs(blocks):
            part = data[i * self.block:(i + n) * self.block]
            self._span(blocks[i], n).view(-1)[:part.numel()].copy_(part, non_blocking=True)

    # ---- host -> GPU -------------------------------------------------------------------------------
    def load_pages(self, keys: list[bytes], pages: list[int]) -> None:
        """Copy the pages kept under `keys` into GPU pages `pages` (every key must be kept)."""
        for start in range(0, len(keys), STAGE_PAGES):
            ks, ps = keys[start:start + STAGE_PAGES], pages[start:start + STAGE_PAGES]
            blocks = [self.entries[("page", k)][0] for k in ks]
            stage = torch.empty(len(ks), self.block, dtype=torch.uint8, device=self.pools.k.device)
            for i, n in self._runs(blocks):
                stage[i:i + n].copy_(self._span(blocks[i], n), non_blocking=True)
            self.pools.write_pages(ps, stage)
            for k in ks:
                self.entries.move_to_end(("page", k))
        self.hit_pages += len(keys)

    def load_state(self, key: bytes, slot: int) -> None:
        """Copy the snapshot at `key` into GDN state slot `slot`."""
        blocks = self.entries[("state", key)]
        stage = torch.empty(len(blocks) * self.block, dtype=torch.uint8, device=self.pools.conv.device)
        for i, n in self._runs(blocks):
            stage[i * self.block:(i + n) * self.block].copy_(self._span(blocks[i], n).view(-1), non_blocking=True)
        self.pools.write_state(slot, stage[:self.pools.state_nbytes])
        self.entries.move_to_end(("state", key))
        self.hit_snapshots += 1

    # ---- from the CPU (the disk tier) --------------------------------------------------------------
    def _blocks_of(self, kind: str) -> int:
        return 1 if kind == "page" else self.state_blocks

    def room(self, entries: list[tuple[str, bytes]]) -> int:
        """How many of the (kind, key) entries, in order, reserve() would place now: free blocks, the budget's
        unallocated ones and those of the entries it may evict (not held, not in `entries`); one kept or loading
        already needs none."""
        left = self._unused() + self._evictable(set(entries))
        for i, entry in enumerate(entries):
            if entry not in self.entries and entry not in self.loading:
                left -= self._blocks_of(entry[0])
                if left < 0:
                    return i
        return len(entries)

    def reserve(self, entries: list[tuple[str, bytes]]) -> list[tuple[str, bytes, list[torch.Tensor]]]:
        """Blocks for the (kind, key) entries neither kept nor loading, in the order given, until no room is left:
        [(kind, key, views)] (views: 1-D uint8 tensors, in order, exactly the entry's bytes) for the caller to fill,
        from any thread, and then hand to finish(). Until then they are loading: not kept, never evicted."""
        if self.pinned:
            torch.cuda.current_stream().synchronize()     # no queued copy may still read the blocks reused here
        placed, was_held = [], set(self.held)
        for kind, key in entries:
            if (kind, key) in self.entries:
                self.entries.move_to_end((kind, key))
                self.held.add((kind, key))                # the batch never evicts its own entries
                continue
            if (kind, key) in self.loading:
                continue
            nbytes = self.block if kind == "page" else self.pools.state_nbytes
            blocks = self._take(self._blocks_of(kind))
            if blocks is None:
                break                                     # no room left
            self.loading[(kind, key)] = blocks
            views, left = [], nbytes
            for i, n in self._runs(blocks):
                views.append(self._span(blocks[i], n).view(-1)[:left])
                left -= views[-1].numel()
            placed.append((kind, key, views))
        self.held = was_held
        return placed

    def finish(self, placed: list[tuple[str, bytes, list[torch.Tensor]]], filled: list[bool]) -> None:
        """Keep each reserved entry that was filled; give back the blocks of those that were not (or that the GPU
        put here meanwhile: then those are kept)."""
        for (kind, key, _), ok in zip(placed, filled):
            blocks = self.loading.pop((kind, key))
            if ok and (kind, key) not in self.entries:
                self.entries[(kind, key)] = blocks
                self.counts[kind] += 1
            else:
                self.free.extend(reversed(blocks))
