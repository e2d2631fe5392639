"""TextStream: text pieces in, safe text deltas out, with stop strings cut exactly.

Text that might still turn into a stop string is held back until it cannot, so a client never
sees the beginning of a stop sequence that is then retracted.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, stop: list[str]):
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pending = ""      # received but not yet emitted
        self.matched: str | None = None     # the stop string that ended the stream

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, piece: str) -> str:
        """Feed text; returns the text that is now safe to show (maybe empty)."""
        if self.stopped:
            return ""
        self.pending += piece
        found = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stop) if i >= 0]
        if found:
            cut, self.matched = min(found)
            out, self.pending = self.pending[:cut], ""
        else:
            keep = self._partial_stop_len()
            out = self.pending[:len(self.pending) - keep]
            self.pending = self.pending[len(out):]
        return out

    def finish(self, piece: str = "") -> str:
        """End of the stream: `piece` (the last text), then whatever the hold-back still has."""
        out = self.push(piece)
        if not self.stopped:
            out += self.pending
            self.pending = ""
        return out

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of `pending` that is a proper prefix of some stop string."""
        for n in range(min(self.hold, len(self.pending)), 0, -1):
            tail = self.pending[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
