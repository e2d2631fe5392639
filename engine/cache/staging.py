"""StagingRing: the disk tier's write staging, one host buffer that write jobs take pieces of in turn.

The engine loop copies a finished turn's pages and snapshot off the GPU into host memory and the disk tier's writer
thread writes them out, in the order they were queued. Pinned memory lets that copy run without stopping the loop,
but a pinned buffer per job is rounded up to a power of two by torch's pinned allocator and kept for reuse by size:
in the GPU soak the staging held about 4.2 GB for a 2 GiB bound. One buffer of exactly the bound, allocated on the first
write and taken as a ring (a piece is taken after the newest; the single writer gives them back in about that order),
makes the bound the memory. Unpinned staging (a CPU engine) takes a buffer per job: ordinary memory goes back when
it is freed.
"""

from __future__ import annotations

from collections import deque

import torch


class StagingRing:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.buffer: torch.Tensor | None = None     # pinned, once a job on a GPU needs it
        self.live: deque[tuple[int, int]] = deque()  # [start, end) of each piece not yet given back, oldest first

    @property
    def used(self) -> int:
        return sum(end - start for start, end in self.live)

    def take(self, n: int) -> int | None:
        """Reserve n contiguous bytes after the newest piece (or from the start, past the oldest); None if they
        do not fit now."""
        if n > self.capacity:
            return None
        start: int | None
        if not self.live:
            start = 0
        else:
            head, tail = self.live[-1][1], self.live[0][0]
            if head > tail:                          # in use: [tail, head)
                start = head if head + n <= self.capacity else (0 if n <= tail else None)
            else:                                    # wrapped, in use: [tail, capacity) and [0, head)
                start = head if head + n <= tail else None
        if start is not None:
            self.live.append((start, start + n))
        return start

    def view(self, start: int, shape: tuple[int, int], pinned: bool) -> torch.Tensor:
        """The piece taken at `start` as a uint8 tensor of `shape`."""
        if not pinned:
            return torch.empty(shape, dtype=torch.uint8)
        if self.buffer is None:
            self.buffer = torch.empty(self.capacity, dtype=torch.uint8, pin_memory=True)
        return self.buffer[start:start + shape[0] * shape[1]].view(shape)

    def give_back(self, start: int) -> None:
        """The piece taken at `start` is written out (or failed): free it. Space behind a piece given back out of
        order is taken again once the pieces before it are given back."""
        self.live.remove(next(piece for piece in self.live if piece[0] == start))
