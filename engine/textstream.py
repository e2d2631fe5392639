"""TextStream: token ids in, safe text deltas out, with stop strings cut exactly.

Text that might still turn into a stop string is held back until it cannot, so a client never
sees the beginning of a stop sequence that is then retracted.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, detokenizer, stop: list[str]):
        self.detok = detokenizer
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pending = ""      # decoded but not yet emitted
        self.text = ""         # everything emitted
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Feed one token; returns the text that is now safe to show (maybe empty)."""
        return self._advance(self.detok.push(token_id))

    def finish(self) -> str:
        """End of generation: flush what the detokenizer and the hold-back still have."""
        out = self._advance(self.detok.flush())
        if not self.stopped:
            out += self.pending
            self.text += self.pending
            self.pending = ""
        return out

    def _advance(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.pending += piece
        cut = min((i for i in (self.pending.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
        else:
            keep = self._partial_stop_len()
            out = self.pending[:len(self.pending) - keep]
            self.pending = self.pending[len(out):]
        self.text += out
        return out

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of `pending` that is a proper prefix of some stop string."""
        for n in range(min(self.hold, len(self.pending)), 0, -1):
            tail = self.pending[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
