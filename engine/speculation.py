"""The engine's side of speculative decoding: which sequences speculate, a round's inputs from them, the tokens a round
commits, the rolling prefix-cache snapshot inside a round, when speculating pays, and what it did per request.

A decode step speculates when every running sequence can: its sampling needs no host work per token (no logits
processors, penalties or logprobs), no forced token is pending, and no thinking budget can run out inside the round.
Otherwise, or while speculation does not pay, the step is a plain one (engine.py _decode). The round itself is
engine/speculative.py.

When it pays: a round of k drafts costs about a plain step plus k draft steps and yields 1 + (drafts kept) tokens.
The engine times rounds and plain steps as they run; when tokens per second of rounds fall below plain steps'
(acceptance too low: a draft head that does not predict this text, long contexts, many sequences at once), it decodes
plainly for a while (doubling each time it finds speculation still does not pay, up to MAX_PLAIN_STEPS) and then
tries rounds again. Plain steps are timed when they happen anyway, else a few are taken to compare with.
"""

from __future__ import annotations

import time
import torch

from engine.cache_manager import CacheManager
from engine.params import SpeculationStats
from engine.sequence import Sequence
from engine.speculative import RoundGraphs, RoundRequest, Speculator, round_inputs

MIN_PLAIN_STEPS, MAX_PLAIN_STEPS = 16, 512
PROBE_ROUNDS, REMEASURE = 8, 512
EMA = 0.2                    # weight of the newest measurement


class Pays:
    """Whether rounds beat plain steps, from both measured as they run (tokens per second, moving averages). Plain
    steps are measured when some happen anyway, else after PROBE_ROUNDS rounds, and again every REMEASURE rounds."""

    def __init__(self):
        self.round_rate: float | None = None      # tokens per second of rounds (all sequences)
        self.plain_rate: float | None = None
        self.plain_left = 0                       # plain steps still to take before trying rounds again
        self.backoff = MIN_PLAIN_STEPS
        self.rounds = 0                           # rounds since plain steps were last measured

    def speculate(self) -> bool:
        return self.plain_left == 0

    def round_done(self, tokens: int, seconds: float) -> None:
        self.round_rate = _ema(self.round_rate, tokens / max(seconds, 1e-9))
        self.rounds += 1
        if self.plain_rate is None or self.rounds >= REMEASURE:
            if self.rounds >= PROBE_ROUNDS:           # time some plain steps to compare with
                self.plain_left, self.plain_rate = MIN_PLAIN_STEPS, None
        elif self.round_rate < self.plain_rate:
            self.plain_left = self.backoff
            self.backoff = min(2 * self.backoff, MAX_PLAIN_STEPS)
        else:
            self.backoff = MIN_PLAIN_STEPS

    def plain_done(self, tokens: int, seconds: float) -> None:
        self.plain_rate = _ema(self.plain_rate, tokens / max(seconds, 1e-9))
        self.rounds = 0
        if self.plain_left:
            self.plain_left -= 1
            if self.plain_left == 0:
                self.round_rate = None            # measure rounds afresh


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


class Speculation:
    def __init__(self, speculator: Speculator, cache: CacheManager, max_batch: int, cuda_graphs: bool):
        self.spec, self.cache, self.k = speculator, cache, speculator.k
        self.max_pages = -(-speculator.max_seq_len // cache.page_size)     # block tables cover every verify row
        self.graphs = None
        if cuda_graphs and cache.pools.conv.is_cuda:
            buckets = [b for b in (1, 2, 4, 8) if b <= max(1, max_batch)]
            if max_batch > buckets[-1]:
                buckets.append(max_batch)
            self.graphs = RoundGraphs(speculator, buckets, self.max_pages, cache.scratch_slot)
        self.pays = Pays()
        self.adaptive = True                      # off: every eligible step speculates (measurements)
        self.totals = SpeculationStats()          # every sequence's rounds together
        self.round_ms = 0.0                       # time in rounds (host view, waiting for tokens; captures not)

    def use_oracle(self, oracle, adaptive: bool = True) -> None:
        """Drafts from a DraftOracle (engine/speculative.py; None: the MTP's own); captured rounds are dropped.
        adaptive False: speculate at every eligible step, paying or not (to time rounds)."""
        self.spec.set_oracle(oracle)
        self.adaptive, self.pays = adaptive, Pays()
        if self.graphs is not None:
            self.graphs.clear()

    # ---- which steps speculate ------------------------------------------------------------------------------------
    def eligible(self, seq: Sequence) -> bool:
        p = seq.params
        m = seq.matcher           # a grammar needs each token before the next mask; one waiting for its trigger
        if not seq.sampled_on_device or (m is not None and (m.active or m.banned)):   # (<tool_call>) ends the round
            return False
        stream = seq.stream
        return not (p.thinking_budget is not None and stream.in_reasoning
                    and stream.reasoning_tokens + self.k + 1 >= p.thinking_budget)

    def wants(self, seqs: list[Sequence]) -> bool:
        return bool(seqs) and (not self.adaptive or self.pays.speculate()) and all(self.eligible(s) for s in seqs)

    # ---- drafts of a new sequence ---------------------------------------------------------------------------------
    def start(self, seqs: list[Sequence], hidden: torch.Tensor) -> None:
        """Sequences whose first token was just sampled from their prompt's last hidden states [N, H]: draft d_1."""
        reqs = [self._request(s, base=s.num_computed - 1) for s in seqs]
        self.spec.first_draft(round_inputs(reqs, self.max_pages, hidden.device), hidden)
        if self.spec.oracle is not None:
            for s in seqs:
                self.spec.oracle.assign(s.state_slot, s.prompt)

    # ---- one round ------------------------------------------------------------------------------------------------
    def round(self, seqs: list[Sequence]) -> list[list[int]]:
        """One round over these sequences (their pages grown for its rows first); returns each one's new tokens
        (1 .. k + 1), which the caller commits one by one (engine.py _commit), calling `passed` when a sequence's
        committed tokens reach the page boundary the round snapshotted, and `round_over` at the end."""
        k, page = self.k, self.cache.page_size
        reqs = []
        for s in seqs:
            self.cache.grow(s.pages, min(s.num_computed + k + 1, s.max_total))
            boundary = (s.num_computed + k + 1) // page * page
            slot = self.cache.snapshots.take() if boundary > s.num_computed else -1
            s.spec_snapshot = (boundary, slot) if slot >= 0 else None
            row = boundary - s.num_computed - 1 if slot >= 0 else -1
            reqs.append(self._request(s, base=s.num_computed, snap_row=row, snap_slot=slot))
        sampled = any(s.params.temperature > 0 for s in seqs)
        started = time.perf_counter()
        graphed = self.graphs is not None and self.graphs.fits(len(seqs))
        timed = not graphed or self.graphs.captured(len(seqs), sampled)      # a capture is no round's cost
        if graphed:
            out = self.graphs.run(reqs, sampled)
        else:
            out = self.spec.round(round_inputs(reqs, self.max_pages, self.spec.pools.conv.device), sampled)
        kept, tokens = out.kept.tolist(), out.tokens.tolist()
        seconds = time.perf_counter() - started
        if timed:
            self.round_ms += 1e3 * seconds
            self.pays.round_done(sum(kept) + len(seqs), seconds)
        for s, n in zip(seqs, kept):
            s.spec_counts.add(k, n)
            self.totals.add(k, n)
        return [t[:n + 1] for t, n in zip(tokens, kept)]

    def boundary(self, seq: Sequence) -> int:
        """The page boundary whose state the round snapshotted for this sequence (-1: none)."""
        return seq.spec_snapshot[0] if seq.spec_snapshot else -1

    def passed(self, seq: Sequence) -> None:
        """The sequence's committed tokens reached the round's snapshot boundary: index the full page; the snapshot
        becomes its rolling end-of-turn snapshot (the older one is given back)."""
        _, slot = seq.spec_snapshot
        seq.spec_snapshot = None
        self.cache.index_pages(seq.hashes, seq.hash_tokens, seq.num_computed, seq.pages)
        if seq.rolling_slot >= 0:
            self.cache.snapshots.drop(seq.rolling_slot)
        seq.rolling_slot = slot

    def round_over(self, seq: Sequence) -> None:
        """A snapshot whose boundary the committed tokens did not reach holds nothing of use: give its slot back."""
        if seq.spec_snapshot:
            self.cache.snapshots.drop(seq.spec_snapshot[1])
            seq.spec_snapshot = None

    def _request(self, s: Sequence, base: int, snap_row: int = -1, snap_slot: int = -1) -> RoundRequest:
        p = s.params
        return RoundRequest(slot=s.state_slot, base=base, last=s.tokens[base], pages=s.pages,
                            limit=len(s.pages) * self.cache.page_size, snap_row=snap_row,
                            snap_slot=snap_slot if snap_row >= 0 else self.cache.scratch_slot,
                            temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, seed=s.seed,
                            steps=len(s.output), seeded=p.seed is not None, delta=s.position_delta,
                            stop=-1 if s.matcher is None or s.matcher.trigger is None else s.matcher.trigger)

    def stats(self) -> dict:
        t = self.totals
        return {"spec_drafts": self.k, "spec_rounds": t.rounds, "spec_drafted_tokens": t.drafted,
                "spec_accepted_tokens": t.accepted, "spec_tokens_per_round": round(t.tokens_per_round, 3),
                "spec_position_rates": [round(r, 3) for r in t.position_rates], "spec_on": self.pays.speculate(),
                "spec_round_ms_total": self.round_ms}
