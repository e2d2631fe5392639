"""Scheduler: a FIFO of waiting requests and at most C running sequences (the engine bounds the
queue when requests are submitted).

Each engine step runs at most one prefill batch (up to `prefill_chunk` prompt tokens, possibly
from several sequences) and one decode round over every running sequence that has finished its
prompt, so a long prompt arriving never stalls running streams for more than one chunk.
Admission is first come, first served: the head of the queue waits until a slot and the pages
for its whole sequence (prompt + max new tokens) are free. A request whose prefix hit the disk
tier is still reading steps aside meanwhile (keeping its place): those behind it may go first, and
the running streams go on.

Images: a prompt's step ends before the next image whose embeddings are not at hand; the engine encodes one image
at a time, a bounded share of the tower's work per step (engine/vision/encoder.py), so a large image holds up the
running streams by that share per step, not by its whole encode.
"""

from __future__ import annotations

from collections import deque

from engine.cache.manager import CacheManager
from engine.cache.pages import PageTable
from engine.core.sequence import Sequence
from qwendesk_kernels.gdn import RECURRENT_MAX_TOKENS


class Scheduler:
    def __init__(self, cache: CacheManager, max_running: int, prefill_chunk: int, im_start_id: int | None = None):
        self.cache = cache
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk
        self.im_start_id = im_start_id
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self) -> list[Sequence]:
        admitted, aside = [], []
        self.cache.collect_loads()
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            if seq.disk_wait == self.cache.reads_done:    # no read has finished since its lookup said loading (a
                aside.append(seq)                         # lookup hashes the whole prompt: 1.2 ms at 32K tokens)
                continue
            hit = self.cache.match_prefix(seq.hash_tokens)
            if hit.loading:                 # its prefix is being read from disk: those behind it go first meanwhile
                seq.disk_wait = self.cache.reads_done
                aside.append(seq)
                continue
            if not self.cache.can_admit(hit, seq.max_total):
                self.waiting.appendleft(seq)
                break
            seq.pages, seq.state_slot = self.cache.admit(hit, seq.max_total)
            seq.num_computed = seq.cached_tokens = hit.tokens
            seq.snapshot_at = self._snapshot_boundary(seq)
            self.cache.grow(seq.pages, len(seq.prompt))
            self.running.append(seq)
            admitted.append(seq)
        self.waiting.extendleft(reversed(aside))
        return admitted

    def _snapshot_boundary(self, seq: Sequence) -> int:
        """The page boundary at or before the prompt's last <|im_start|> (where the next chat turn
        diverges), if it is past what the prefix cache already gave (-1: none)."""
        page = self.cache.page_size
        end = len(seq.prompt) - 1
        if self.im_start_id is not None and self.im_start_id in seq.prompt:
            end = len(seq.prompt) - 1 - seq.prompt[::-1].index(self.im_start_id)
        boundary = end // page * page
        return boundary if boundary > seq.num_computed else -1

    def prefill_batch(self) -> tuple[list[Sequence], list[int], list[int]]:
        """Sequences still in their prompt, how many prompt tokens each runs now, and where inside those the
        GDN state is to be snapshotted (0: nowhere). A step of at most RECURRENT_MAX_TOKENS tokens takes its
        snapshots in passing; a longer one stops each sequence at its snapshot boundary instead (the engine
        then copies the state), because fla's chunked kernel keeps no state inside a chunk. A snapshot at
        least a page into the step keeps the conv window inside it; one at most CacheTensors.snapshot_tail rows before
        its end keeps a block drafter's window in the rings."""
        seqs, lens, cuts, budget = [], [], [], self.prefill_chunk
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.prefilling:
                continue
            n = min(len(seq.prompt) - seq.num_computed, budget)
            for k in seq.pending_images(seq.num_computed, seq.num_computed + n):
                assert seq.images is not None                                   # pending images are its prompt's
                n = max(seq.images.spans[k][0], seq.num_computed) - seq.num_computed   # stop before it: the engine
                break                                                                   # is still encoding it
            if n == 0:
                continue
            cut = seq.snapshot_at - seq.num_computed
            seqs.append(seq)
            lens.append(n)
            cuts.append(cut if 0 < cut < n else 0)
            budget -= n
        tail = self.cache.pools.snapshot_tail
        in_pass = sum(lens) <= RECURRENT_MAX_TOKENS and all(c == 0 or c >= self.cache.page_size for c in cuts) and \
            (tail is None or all(c == 0 or n - c <= tail for c, n in zip(cuts, lens)))
        if not in_pass:
            lens = [c or n for c, n in zip(cuts, lens)]
            cuts = [0] * len(lens)
        return seqs, lens, cuts

    def decode_batch(self) -> list[Sequence]:
        return [s for s in self.running if not s.prefilling and s.finish_reason is None]

    def remove(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out and give back what it holds."""
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _release(self, seq: Sequence) -> None:
        self.cache.release(pages=seq.pages, state_slot=seq.state_slot, total_tokens=seq.max_total, hashes=seq.hashes,
                           tokens=seq.hash_tokens, num_computed=seq.num_computed, rolling_slot=seq.rolling_slot)
        seq.pages, seq.state_slot, seq.rolling_slot = PageTable(), -1, -1
