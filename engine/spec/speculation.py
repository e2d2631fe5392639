"""The engine's side of speculative decoding: which steps speculate and with how many drafts, a round's inputs from
the sequences, the tokens a round commits, the rolling prefix-cache snapshot inside a round, and what it did per
request.

A decode step speculates when every running sequence can: its sampling needs no host work per token (no logits
processors, penalties or logprobs), no forced token is pending, and no thinking budget can run out inside the round.
How many drafts (0: a plain step, EngineLoop._decode) is engine/spec/policy.py's choice, from measured times and the
running acceptance. The round itself is engine/spec/rounds.py; its CUDA graphs (every batch bucket, number of drafts,
greedy and sampled) are captured and timed at load (`capture`), never on a request's path.

A round is launched (`launch`) and read later (`finish`): the loop launches the next round of the same sequences
from the one in flight (its carry, on the device) before it reads and commits that one's tokens, so that the GPU
goes from round to round while the host streams text (`can_follow` says when it may).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.cache.manager import CacheManager
from engine.core.device import copy_behind
from engine.spec.policy import DraftPolicy
from engine.core.params import SpeculationStats
from engine.core.sampling import SamplingRow
from engine.core.sequence import Sequence, submitted
from engine.spec.rounds import RoundGraphs, RoundOutputs, RoundRequest, Rounds, page_boundary, round_inputs
from qwendesk_kernels import gemv_mma


def exact_verify_rows(weights: str, device: torch.device) -> int | None:
    """The most rows a round's verify may have and still compute each row as a plain step does, so that greedy
    speculation is exact: with int4 weights on CUDA, the mma GEMV's (its rows' bits do not depend on how many there
    are; past it the fused GEMM's do not match them). None: no bound known (16-bit weights go through the GPU
    library's matrix products, whose rows may differ at any count: README, issue #41; the CPU runs references)."""
    return gemv_mma.GEMV_MMA_MAX_M if weights == "int4" and device.type == "cuda" else None


@dataclass
class RoundInFlight:
    """A round launched and not yet read. Its kept counts and tokens are copied to the host right behind it
    (engine/core/device.py copy_behind): reading them waits for this round only, not for a round launched after it."""
    seqs: list[Sequence]
    k: int                      # drafts per sequence
    snap_slots: list[int]       # per sequence: the slot given for a snapshot at a page boundary (-1: none)
    carry: torch.Tensor         # RoundOutputs.carry, on the device: where the next round of these sequences starts
    kept: torch.Tensor          # [B], on the host once `ready`
    tokens: torch.Tensor        # [B, k + 1]
    ready: torch.cuda.Event | None    # recorded after the copies (None on the CPU)
    launched: float             # perf_counter when its launch began

    @classmethod
    def of(cls, seqs: list[Sequence], k: int, snap_slots: list[int], out: RoundOutputs,
           launched: float) -> RoundInFlight:
        (kept, tokens), ready = copy_behind(out.kept, out.tokens)
        return cls(seqs, k, snap_slots, out.carry, kept, tokens, ready, launched)

    def read(self) -> tuple[list[int], list[list[int]]]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.kept.tolist(), self.tokens.tolist()


class Speculation:
    def __init__(self, speculator: Rounds, cache: CacheManager, buckets: list[int], graphs: bool,
                 plain_times: dict[int, float] | None = None, max_rows: int | None = None):
        """speculator: the rounds of the MTP head (RoundRunner) or of a block drafter (BlockRoundRunner); buckets: the
        batch sizes decode steps and rounds run at (padded up); graphs: rounds replay CUDA graphs
        (captured by `capture`); plain_times: {bucket: seconds} of the plain decode graphs (the policy's start);
        max_rows: the most rows a verify may have and stay exact (exact_verify_rows; None: no bound)."""
        self.spec, self.cache, self.max_k = speculator, cache, speculator.k
        self.buckets = buckets
        # per bucket, the most drafts of a round whose verify (bucket x (k + 1) rows) stays within max_rows
        self.most = {b: max([0] + [k for k in speculator.draft_counts() if max_rows is None or b * (k + 1) <= max_rows])
                     for b in buckets}
        self.max_pages = -(-speculator.max_seq_len // cache.page_size)     # block tables cover every verify row
        self.graphs = RoundGraphs(speculator, buckets, self.max_pages, cache.scratch_slot) if graphs else None
        self.plain_times = dict(plain_times or {})
        self.policy = self._new_policy()
        self.adaptive = True                      # off: every eligible step makes max_k drafts (measurements)
        self.totals = SpeculationStats(method=speculator.method)   # every sequence's rounds together
        self.round_ms = 0.0                       # wall time of rounds: each from its launch or the read of the
        self._read_at = 0.0                       # round before, whichever is later, to the read of its tokens
        self.followed = 0                         # rounds launched from a round in flight (`can_follow`)
        self._last: tuple[int, tuple[int, ...]] | None = None   # the last decode step: (drafts, sequence ids)
        self.steps_by_drafts = [0] * (self.max_k + 1)   # decode steps run with k drafts each (0: plain steps)

    def capture(self, progress=None) -> None:
        """Capture (and time) every round the engine can run: each batch bucket, each of the drafter's draft counts
        (MTP: 1 .. max_k), greedy and sampled; kernels compile and tune in the runs before each capture.
        progress(done, total)."""
        if self.graphs is None:
            return
        variants = [(b, k, sampled) for b in self.buckets for k in self.spec.draft_counts() if k <= self.most[b]
                    for sampled in (False, True)]
        for i, (b, k, sampled) in enumerate(variants):
            if progress is not None:
                progress(i, len(variants))
            self.graphs.capture(b, k, sampled)
        self.policy = self._new_policy()

    def _new_policy(self) -> DraftPolicy:
        warm = {(0, b): t for b, t in self.plain_times.items()}
        if self.graphs is not None:
            warm.update({(k, b): t for (b, k, sampled), t in self.graphs.seconds.items() if not sampled})
        return DraftPolicy(self.max_k, self.buckets, warm if self.graphs is not None else None, self.most)

    def use_oracle(self, oracle, adaptive: bool = True) -> None:
        """Drafts from a DraftOracle (engine/bench/oracle.py; None: the MTP's own); the rounds are captured again when
        the oracle comes or goes. adaptive False: every eligible step makes max_k drafts, paying or not (to time
        rounds)."""
        recapture = self.spec.set_oracle(oracle)
        self.adaptive = adaptive
        if self.graphs is not None and recapture:
            self.graphs.clear()
            self.capture()
        self.policy = self._new_policy()

    # ---- which steps speculate ------------------------------------------------------------------------------------
    def eligible(self, seq: Sequence, k: int) -> bool:
        p = seq.params
        m = seq.matcher           # a grammar needs each token before the next mask; one waiting for its trigger
        if not seq.sampled_on_device or (m is not None and (m.active or m.banned)):   # (<tool_call>) ends the round
            return False
        stream = submitted(seq)
        return not (p.thinking_budget is not None and stream.in_reasoning
                    and stream.reasoning_tokens + k + 1 >= p.thinking_budget)

    def drafts(self, seqs: list[Sequence]) -> int:
        """Drafts each sequence makes in the next decode step: 0 for a plain step."""
        if not seqs:
            return 0
        k = (self.policy.choose(len(seqs), max(s.num_computed for s in seqs)) if self.adaptive
             else self.policy.most_drafts(self.policy.bucket(len(seqs))))
        k = k if k and all(self.eligible(s, k) for s in seqs) else 0
        self.steps_by_drafts[k] += 1
        return k

    def step_done(self, k: int, seqs: list[Sequence], seconds: float) -> None:
        """A step that only decoded these sequences (k drafts each; 0: plain) took `seconds` of wall time: measured
        unless the step before was of another kind or batch (its GPU work was still finishing during this one)."""
        now = (k, tuple(s.id for s in seqs))
        if self._last == now and seqs:
            self.policy.step_time(k, len(seqs), max(s.num_computed for s in seqs), seconds)
        self._last = now

    def step_mixed(self) -> None:
        """A step that also prefilled or encoded: the next decode step is not measured either."""
        self._last = None

    # ---- drafts of a new sequence ---------------------------------------------------------------------------------
    def start(self, seqs: list[Sequence], hidden: torch.Tensor) -> None:
        """Sequences whose first token was just sampled from their prompt's last hidden states [N, H]: draft d_1."""
        for s in seqs:
            s.spec_counts.method = self.spec.method
        reqs = [self._request(s, base=s.num_computed - 1) for s in seqs]
        self.spec.first_draft(round_inputs(reqs, self.max_pages, hidden.device), hidden)
        if self.spec.oracle is not None:
            for s in seqs:
                self.spec.oracle.assign(s.state_slot, s.prompt)

    # ---- one round ------------------------------------------------------------------------------------------------
    def can_follow(self, flight: RoundInFlight, seqs: list[Sequence], k: int) -> bool:
        """Whether a round of k drafts over `seqs` may be launched from `flight` before the host reads it: the same
        sequences, each one eligible still after the tokens in flight (a thinking budget counts both rounds), none
        that the round in flight may bring to the end of its context (the rows past it would reach beyond the
        block tables). A sequence that the round in flight ends (a stop) has one round too many run: its tokens
        are dropped; one whose round in flight ends at its stop token (a grammar's trigger) does nothing in this
        one (RoundInputs.halted)."""
        ahead = flight.k + 1
        return [s.id for s in seqs] == [s.id for s in flight.seqs] and all(
            s.num_computed + ahead < s.max_total and self.eligible(s, k + ahead) for s in seqs)

    def launch(self, seqs: list[Sequence], k: int, after: RoundInFlight | None = None) -> RoundInFlight:
        """Start a round of k drafts over these sequences: their pages grown for its rows, a snapshot slot given to
        each one whose rows may reach a page boundary. after: the round in flight of the same sequences
        (`can_follow`), not yet read: this one starts where that one ends (its carry), and is sized for any number
        of tokens it may keep."""
        started = time.perf_counter()
        page, reach = self.cache.page_size, self.spec.reach_of(k)
        ahead = after.k + 1 if after is not None else 0      # the round in flight adds 1 .. ahead tokens
        reqs, slots = [], []
        for s in seqs:
            n = s.num_computed
            self.cache.grow(s.pages, min(n + ahead + reach, s.max_total))
            first = n + 1 if after is not None else n         # the lowest base this round may start from
            slot = self.cache.snapshots.take() if page_boundary(n + ahead, k + 1, page) > first else -1
            slots.append(slot)
            reqs.append(self._request(s, base=n, snap_slot=slot))
        sampled = any(s.params.temperature > 0 for s in seqs)
        carry = after.carry if after is not None else None
        if self.graphs is not None and self.graphs.fits(len(seqs)):
            out = self.graphs.run(reqs, k, sampled, carry)
        else:
            inp = round_inputs(reqs, self.max_pages, self.spec.pools.conv.device, carry=carry)
            out = self.spec.round(inp, sampled, k)
        for s, slot in zip(seqs, slots):   # a block drafter's rings hold the window before the boundary: copy them
            if slot >= 0:
                self.cache.pools.copy_rings(s.state_slot, slot)
        self.followed += after is not None
        return RoundInFlight.of(seqs, k, slots, out, started)

    def finish(self, flight: RoundInFlight) -> list[list[int]]:
        """Read a round's tokens (waiting for that round only): each sequence's new tokens (1 .. k + 1; none for one
        that ended meanwhile or whose round was halted), which the caller commits one by one (EngineLoop._commit),
        calling `passed` when a sequence's committed tokens reach the page boundary inside the round's rows, and
        `round_over` at the end. The round before it has been committed by now (before or after this one's launch):
        each sequence still running has its num_computed at this round's base."""
        kept, tokens = flight.read()
        now = time.perf_counter()
        self.round_ms += 1e3 * (now - max(flight.launched, self._read_at))
        self._read_at = now
        page = self.cache.page_size
        counted: list[int] = []
        new: list[list[int]] = []
        for s, slot, n, row in zip(flight.seqs, flight.snap_slots, kept, tokens):
            if s.finish_reason is not None or n < 0:
                if slot >= 0:
                    self.cache.snapshots.drop(slot)
                new.append([])
                continue
            boundary = page_boundary(s.num_computed, flight.k + 1, page)
            if boundary > s.num_computed:           # the device snapshotted there when it had a slot (-1: none)
                s.spec_snapshot = (boundary, slot)
            elif slot >= 0:
                self.cache.snapshots.drop(slot)
            s.spec_counts.add(flight.k, n)
            self.totals.add(flight.k, n)
            counted.append(n)
            new.append(row[:n + 1])
        self.policy.kept_drafts(flight.k, counted)
        return new

    def abandon(self, flight: RoundInFlight) -> None:
        """A round in flight that nobody will read (a failed step): give back its snapshot slots."""
        for slot in flight.snap_slots:
            if slot >= 0:
                self.cache.snapshots.drop(slot)

    def boundary(self, seq: Sequence) -> int:
        """The page boundary inside the round's rows (-1: none)."""
        return seq.spec_snapshot[0] if seq.spec_snapshot else -1

    def passed(self, seq: Sequence) -> int:
        """The sequence's committed tokens reached the page boundary inside the round's rows: the slot holding the
        state there (-1: none could be had), which the loop makes the rolling snapshot (EngineLoop._page_passed)."""
        assert seq.spec_snapshot is not None, "passed a boundary the round did not note"
        _, slot = seq.spec_snapshot
        seq.spec_snapshot = None
        return slot

    def round_over(self, seq: Sequence) -> None:
        """A snapshot whose boundary the committed tokens did not reach holds nothing of use: give its slot back."""
        if seq.spec_snapshot:
            if seq.spec_snapshot[1] >= 0:
                self.cache.snapshots.drop(seq.spec_snapshot[1])
            seq.spec_snapshot = None

    def _request(self, s: Sequence, base: int, snap_slot: int = -1) -> RoundRequest:
        return RoundRequest(slot=s.state_slot, base=base, last=s.tokens[base], pages=s.pages,
                            limit=len(s.pages) * self.cache.page_size,
                            snap_slot=snap_slot if snap_slot >= 0 else self.cache.scratch_slot,
                            sampling=SamplingRow.of(s), delta=s.position_delta,
                            stop=-1 if s.matcher is None or s.matcher.trigger is None else s.matcher.trigger)

    def stats(self) -> dict:
        t = self.totals
        now = self.policy.last if self.adaptive else self.max_k
        return {"spec_method": self.spec.method, "spec_drafts": self.max_k, "spec_drafts_now": now,
                "spec_drafts_most": dict(self.most),
                "spec_on": bool(now), "spec_rounds": t.rounds,
                "spec_drafted_tokens": t.drafted, "spec_accepted_tokens": t.accepted,
                "spec_tokens_per_round": round(t.tokens_per_round, 3),
                "spec_position_rates": [round(r, 3) for r in t.position_rates], "spec_round_ms_total": self.round_ms,
                "spec_rounds_followed": self.followed,
                "spec_steps_by_drafts": list(self.steps_by_drafts),
                "spec_policy_tok_s": {k: round(r, 1) for k, r in self.policy.last_rates.items()}}
