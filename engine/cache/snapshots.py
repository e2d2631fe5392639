"""Snapshots: copies of Gated DeltaNet state kept for prefix reuse, in the state slots above the live ones.

GDN state is cumulative, so reusing a prefix of b tokens also needs the state exactly after b tokens. A
snapshot is a slot holding that state at a page boundary, kept under the chained hash of the page ending
there (the key the prefix index files that page under); when a slot is needed and none is free, the least
recently used snapshot gives up its slot. Snapshots are taken at two kinds of boundary:
  - at the prompt's snapshot boundary (the scheduler's choice: before its last `<|im_start|>`, where the
    next chat turn diverges), in passing: a prefill step writes the state into a slot taken here (`take`,
    then `keep` or `drop`); or copied from the sequence's live slot after a step that ended there (`save`);
  - rolling: while a sequence decodes, its state at the latest page boundary it passed is copied into a slot
    it holds (`roll`); when it ends, that slot becomes the end-of-turn snapshot (`promote`).
A prefix hit copies a snapshot into the new sequence's live slot (`restore`); a page leaving the prefix
index takes its snapshot with it (`forget`). A snapshot leaving (evicted or forgotten) is first handed to
`on_evict(key, slot)` when one is given: the host tier copies it out (engine.cache.host).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from engine.cache.pages import CacheTensors


class Snapshots:
    def __init__(self, pools: CacheTensors, slots: range, on_evict: Callable[[bytes, int], None] | None = None):
        self.pools = pools
        self.on_evict = on_evict
        self._free = list(reversed(slots))                       # the lowest slot is taken first
        self._kept: OrderedDict[bytes, int] = OrderedDict()      # page hash -> slot, least recently used first

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: bytes) -> bool:
        return key in self._kept

    def take(self) -> int:
        """A slot to write a snapshot into: a free one, else the least recently used snapshot's (-1: none)."""
        if self._free:
            return self._free.pop()
        if self._kept:
            key, slot = self._kept.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(key, slot)
            return slot
        return -1

    def keep(self, slot: int, key: bytes) -> None:
        """Keep the state in `slot` (taken here) as the snapshot at `key`, replacing an older one there."""
        old = self._kept.pop(key, None)
        if old is not None and old != slot:
            self._free.append(old)
        self._kept[key] = slot

    def drop(self, slot: int) -> None:
        """Give back a slot taken here and not kept."""
        self._free.append(slot)

    def save(self, live_slot: int, key: bytes) -> None:
        """Copy a live sequence's state into the snapshot at `key`, if a slot can be had."""
        slot = self.take()
        if slot >= 0:
            self.pools.copy_state(live_slot, slot)
            self.keep(slot, key)

    def restore(self, key: bytes, live_slot: int) -> None:
        """Copy the snapshot at `key` into a live slot (a prefix hit); it becomes the most recently used."""
        self._kept.move_to_end(key)
        self.pools.copy_state(self._kept[key], live_slot)

    def forget(self, key: bytes) -> None:
        """Drop the snapshot at `key`, if there is one (its page left the prefix index)."""
        slot = self._kept.pop(key, None)
        if slot is not None:
            if self.on_evict is not None:
                self.on_evict(key, slot)
            self._free.append(slot)

    def slot(self, key: bytes) -> int:
        """The slot holding the snapshot at `key` (which must be kept)."""
        return self._kept[key]

    def roll(self, live_slot: int, rolling_slot: int) -> int:
        """Copy a decoding sequence's state (at a page boundary) into its rolling snapshot, taking a slot for it
        when it has none (rolling_slot -1). Returns the rolling slot (-1: none could be had)."""
        if rolling_slot < 0:
            rolling_slot = self.take()
        if rolling_slot >= 0:
            self.pools.copy_state(live_slot, rolling_slot)
        return rolling_slot

    def promote(self, rolling_slot: int, key: bytes | None) -> None:
        """A sequence has ended: its rolling snapshot (if it has one) becomes the end-of-turn snapshot at `key`, the
        hash of the last page boundary it passed. key None: that page is not indexed (nobody could find the
        snapshot), so the slot is given back."""
        if rolling_slot < 0:
            return
        if key is None:
            self.drop(rolling_slot)
        else:
            self.keep(rolling_slot, key)
