"""How many drafts the next speculative round makes (0: a plain decode step instead), chosen before each decode step
from measured step times and the running acceptance, per batch bucket and context length.

A round of k drafts over n sequences yields n (1 + a_1 + a_1 a_2 + ... + a_1 ... a_k) tokens on average, where a_j is
the chance that draft j is kept when the drafts before it were (running estimates over every sequence's rounds,
decayed so that they follow the text being written); it takes t(k, b, c), the wall time of a round for batch bucket b
at context class c. A plain step yields n tokens in t(0, b, c). The policy picks the k with the most tokens per second,
so speculation is never a net loss where the estimates hold: too few drafts kept, a long context, a large batch, each
moves the choice down to fewer drafts or to plain steps.

Times are the wall times of whole engine steps that only decoded, measured as they run (EngineLoop.step), moving
averages per (k, b, c); a step that switched kind or batch is not measured (the step before it is still finishing on
the GPU). A kind not yet measured at (b, c) is estimated as its warm-up time (each CUDA graph is timed when it is
captured at load: `warm`) plus what the context adds at b, learnt from whatever ran there. Without warm-up times (no
CUDA graphs: the CPU) the choice is between plain steps and the most drafts only, and plain steps are timed by a few
probes after the first rounds.

While plain steps win, acceptance is not observed: a probe round of one draft runs after PROBE_MIN plain steps,
the wait doubling up to PROBE_MAX while plain steps keep winning.
"""

from __future__ import annotations

import math

EMA = 0.2                   # weight of a new time measurement
DECAY = 0.95                # acceptance counts kept per round: the estimates follow about the last 20 rounds
PRIOR_RATE, PRIOR_WEIGHT = 0.8, 0.5   # before any round: a draft kept 80% of the time (MTP heads: 93 / 87 / 79%)
PROBE_ROUNDS = 4            # without warm-up times: rounds before plain steps are first timed
PROBE_MIN, PROBE_MAX = 16, 512
CONTEXT_CLASS_TOKENS = 2048  # context classes: up to 2K, 4K, 8K, ... tokens (powers of two)


def context_class(tokens: int) -> int:
    return max(0, math.ceil(math.log2(max(tokens, 1) / CONTEXT_CLASS_TOKENS)))


class DraftPolicy:
    def __init__(self, max_k: int, buckets: list[int], warm: dict[tuple[int, int], float] | None = None,
                 most: dict[int, int] | None = None):
        """max_k: the most drafts a round may make; buckets: the batch sizes rounds and steps are run (padded) at;
        warm: {(k, bucket): seconds} of each captured graph (k = 0: the plain decode step); most: {bucket: the most
        drafts a round of it may make} where that is fewer than max_k (Speculation: a verify's rows bounded)."""
        self.max_k, self.buckets, self.most = max_k, buckets, dict(most or {})
        self.warm = dict(warm or {})
        self.times: dict[tuple[int, int, int], float] = {}       # (k, b, c) -> seconds
        self.extra: dict[tuple[int, int], float] = {}            # (b, c) -> seconds the context adds to the warm time
        self.tried = [0.0] * max_k                               # decayed counts per draft position
        self.kept = [0.0] * max_k
        self.rounds_at: dict[tuple[int, int], int] = {}          # rounds measured at (b, c) (no warm-up times)
        self.plain_run, self.probe_every = 0, PROBE_MIN
        self.last = 0                                            # the last choice (stats)
        self.last_rates: dict[int, float] = {}                   # and the tokens per second it expected of each k

    # ---- the choice -----------------------------------------------------------------------------------------------
    def choose(self, n: int, context: int) -> int:
        """Drafts for the next step of n sequences whose longest holds `context` tokens (0: a plain step)."""
        b, c = self.bucket(n), context_class(context)
        top = self.most_drafts(b)
        est = {k: self.estimate(k, b, c) for k in range(top + 1)}
        if top == 0:
            k = 0
        elif est[0] is None:                     # plain steps not timed here, nothing to estimate them from
            k = 0 if self.rounds_at.get((b, c), 0) >= PROBE_ROUNDS else top
        else:
            rates = {k: self.tokens(n, k) / t for k, t in est.items() if t is not None}
            k = max(rates, key=lambda k: rates[k])
            self.last_rates = rates
            if k == 0:
                self.plain_run += 1
                if self.plain_run >= self.probe_every:            # look at the acceptance again
                    self.plain_run, self.probe_every = 0, min(2 * self.probe_every, PROBE_MAX)
                    k = 1 if est[1] is not None else top
            else:
                self.plain_run, self.probe_every = 0, PROBE_MIN
        self.last = k
        return k

    def most_drafts(self, b: int) -> int:
        """The most drafts a round of batch bucket b may make."""
        return self.most.get(b, self.max_k)

    def tokens(self, n: int, k: int) -> float:
        """Tokens a round of k drafts yields for n sequences, on average."""
        total, run = 1.0, 1.0
        for j in range(k):
            run *= self.rate(j)
            total += run
        return n * total

    def rate(self, j: int) -> float:
        """The chance that draft j + 1 is kept when the drafts before it were."""
        return (self.kept[j] + PRIOR_RATE * PRIOR_WEIGHT) / (self.tried[j] + PRIOR_WEIGHT)

    def estimate(self, k: int, b: int, c: int) -> float | None:
        if (k, b, c) in self.times:
            return self.times[(k, b, c)]
        if (k, b) in self.warm:
            return self.warm[(k, b)] + self._extra(b, c)
        return None

    def _extra(self, b: int, c: int) -> float:
        """What context class c adds at bucket b: learnt there, else at the nearest shorter class measured."""
        return next((self.extra[(b, d)] for d in range(c, -1, -1) if (b, d) in self.extra), 0.0)

    def bucket(self, n: int) -> int:
        return next((x for x in self.buckets if x >= n), n)

    # ---- what was observed ----------------------------------------------------------------------------------------
    def kept_drafts(self, k: int, kept: list[int]) -> None:
        """A round of k drafts kept kept[i] of sequence i's (a rejection at kept[i] + 1; nothing known past it)."""
        for j in range(k):
            self.tried[j] *= DECAY
            self.kept[j] *= DECAY
        for n in kept:
            for j in range(min(n + 1, k)):
                self.tried[j] += 1
                self.kept[j] += j < n

    def step_time(self, k: int, n: int, context: int, seconds: float) -> None:
        """A step of n sequences that made k drafts each (0: a plain step) took `seconds` of wall time."""
        b, c = self.bucket(n), context_class(context)
        old = self.times.get((k, b, c))
        self.times[(k, b, c)] = seconds if old is None else (1 - EMA) * old + EMA * seconds
        if (k, b) in self.warm:
            extra = max(0.0, seconds - self.warm[(k, b)])
            old = self.extra.get((b, c))
            self.extra[(b, c)] = extra if old is None else (1 - EMA) * old + EMA * extra
        if k:
            self.rounds_at[(b, c)] = self.rounds_at.get((b, c), 0) + 1
