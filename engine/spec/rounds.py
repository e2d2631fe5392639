"""Speculative decoding with the checkpoint's MTP head, up to k drafts per round (engine/spec/policy.py chooses how
many each round), exact.

A round, for B sequences at once, runs on the device with no host sync (one CUDA graph per batch bucket, number of
drafts, greedy / sampled: all captured at load):
  1. drafts 2..k: the MTP layer, one row per sequence, from the previous draft and the MTP's own last hidden
     state; its head reads only the first `draft_vocab` rows of the LM head (the most frequent tokens): verify
     uses the full head, so what is kept stays exact
  2. verify: the main model over [last token, d_1 .. d_k] (k + 1 rows per sequence); GDN layers keep the
     round's start state in the slot and only note each row's inputs (qwendesk_kernels/gdn.py VerifyRows)
  3. accept (engine/spec/acceptance.py): the leading drafts kept and the token after them
  4. replay: every GDN layer's state advanced by the kept rows, one launch (qwendesk_kernels/gdn.py gdn_replay); a page
     boundary inside them also fills the sequence's rolling prefix-cache snapshot
  5. catch-up: the MTP layer over the same k + 1 rows with the kept tokens and the verify's hidden states (its
     KV at those positions made with the true hidden states); the row after the last kept one drafts d_1 of
     the next round.
  6. carry: where each sequence's next round starts (its base, last token, sampling step, whether this round ended
     at its stop token), on the device: the next round of the same sequences can be launched from it before the
     host has read this one's tokens (engine/spec/speculation.py `launch`), so the GPU does not wait for the host
     between rounds.
Between rounds each sequence keeps d_1 and the MTP hidden state it came from, in its live state slot's row of
`draft_tokens` / `draft_hidden`. The prompt's MTP KV is made during prefill (`prompt_mtp`) and d_1 of the first
round when its first token is sampled (`first_draft`). MTP KV only steers drafts: where it is stale (a prefix
boundary of a cached prompt, steps decoded without speculation) acceptance may drop, outputs never change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Protocol

import torch

from engine.spec.acceptance import accept, pick_draft
from engine.core.sampling import Sampling, SamplingRow
from engine.core.device import capture_graph, pinned
from engine.core.params import EngineConfig
from engine.cache.pages import CacheTensors
from engine.model.batch import ForwardBatch, page_table
from engine.model.qwen3_5 import Qwen3_5Model
from qwendesk_kernels.gdn import VerifyRows, gdn_replay


class DraftHook(Protocol):
    """Drafts replaced inside each round, for measuring (engine/bench/oracle.py DraftOracle, and tests)."""

    def attach(self, previous: DraftHook | None, slots: int, max_context: int, k: int, device) -> None:
        """Its device tensors (a previous hook's, which captured rounds read, else new ones), before any round."""

    def assign(self, slot: int, prompt: list[int]) -> None:
        """A sequence starts drafting in this state slot (Speculation.start)."""

    def apply(self, drafts: torch.Tensor, inp: RoundInputs, vocab: int) -> torch.Tensor:
        """The round's drafts [B, k] -> the ones it verifies (on the device, no host sync: captured)."""


@dataclass
class RoundInputs:
    """One round's per-sequence inputs on the device ([B] unless said; static buffers when graphed). base, last,
    sampling.steps and halted are the rows a round right after another of the same sequences takes from that one's
    RoundOutputs.carry (the first CARRIED rows of round_inputs' int64 buffer)."""
    slots: torch.Tensor          # int64 live state slot (also the row of the draft buffers)
    base: torch.Tensor           # int64 tokens already in the cache (n): the verify rows sit at n .. n + k
    last: torch.Tensor           # int64 the last token, not yet in the cache (x_n)
    halted: torch.Tensor         # int64 1: the round before ended at this row's stop token, so this round does
    #                              nothing for it (kept -1: the state is not advanced; the host goes on without it)
    block_tables: torch.Tensor   # int32 [B, max_pages]
    limit: torch.Tensor          # int64 positions below this have pages (rows past it write no KV)
    snap_slots: torch.Tensor     # int64 where the GDN state at a page boundary inside the kept rows goes (the
    #                              scratch slot: nowhere); the row is the device's: snapshot_rows
    delta: torch.Tensor          # int64 rotary position of row p: p + delta (below 0 after a prompt's images)
    stop: torch.Tensor           # int64 a token that ends the round where it is kept (-1: none)
    sampling: Sampling
    packs: tuple[torch.Tensor, ...] = ()   # the buffers the fields are views of (round_inputs)


@dataclass
class RoundOutputs:
    kept: torch.Tensor           # [B] leading drafts kept (0 .. k; -1: a halted row, nothing new)
    tokens: torch.Tensor         # [B, k + 1]: tokens[:, :kept + 1] are the new tokens
    carry: torch.Tensor          # [CARRIED, B] int64: the next round's base, last, sampling steps and halted


def rows_batch(inp: RoundInputs, offset: int, rows: int, page_size: int, max_seq_len: int,
               verify: VerifyRows | None = None) -> ForwardBatch:
    """The ForwardBatch of `rows` rows per sequence at positions base + offset ..., built on the device."""
    B = inp.base.shape[0]
    dev = inp.base.device
    pos = inp.base[:, None] + offset + torch.arange(rows, device=dev)                  # [B, rows]
    page = (pos // page_size).clamp(max=inp.block_tables.shape[1] - 1)
    slot = inp.block_tables.gather(1, page).long() * page_size + pos % page_size
    slot = torch.where(pos < inp.limit[:, None], slot, torch.full_like(slot, -1))
    return ForwardBatch(positions=(pos + inp.delta[:, None]).reshape(1, -1).expand(3, -1), cu_seqlens=torch.arange(
        B + 1, device=dev, dtype=torch.int32) * rows, seq_lens=(pos[:, -1] + 1).int(),
        has_state=torch.ones(B, dtype=torch.bool, device=dev), state_slots=inp.slots,
        block_tables=inp.block_tables, slot_mapping=slot.reshape(-1), logits_rows=None, decode_len=rows,
        max_seq_len=max_seq_len, verify=verify)


class Rounds:
    """What every drafter's rounds share: the verify of k + 1 rows per sequence, acceptance and the GDN replay (steps
    2-4 above), the draft head, and the DraftHook that may replace drafts. RoundRunner drafts with the MTP head,
    engine/spec/block_rounds.py BlockRoundRunner with a block drafter."""
    method: str                   # how it drafts: "mtp" | "dflash" (EngineConfig.method)

    def __init__(self, model: Qwen3_5Model, pools: CacheTensors, k: int, max_batch: int, max_context: int,
                 draft_vocab: int):
        """k: the most drafts a round makes (buffers are sized for it)."""
        cfg = model.cfg
        assert 1 <= k
        self.model, self.pools, self.k = model, pools, k
        self.scratch = pools.scratch_slot
        self.max_context = max_context
        self.max_seq_len = max_context + self.reach_of(k)   # rows may run past the context (writing nothing there)
        self.draft_vocab = min(draft_vocab, cfg.vocab_size) // 16 * 16 or cfg.vocab_size
        self.rows = VerifyRows.allocate(len(cfg.linear_attention_layers), max_batch, k + 1, cfg.conv_dim,
                                        cfg.linear_num_v_heads, pools.conv.dtype, pools.conv.device)
        self.oracle: DraftHook | None = None

    def reach_of(self, k: int) -> int:
        """Rows past a sequence's cached tokens whose KV a round of k drafts writes (its pages must hold them)."""
        return k + 1

    def draft_counts(self) -> list[int]:
        """The numbers of drafts a round may make (each one's graphs are captured at load): 1 .. k."""
        return list(range(1, self.k + 1))

    def set_oracle(self, oracle: DraftHook | None) -> bool:
        """Replace drafts per a DraftHook (None: back to the drafter's own). Returns whether captured rounds must be
        captured again: a round with an oracle runs other kernels; one oracle after another shares its tensors."""
        if oracle is not None:
            oracle.attach(self.oracle, self.pools.num_slots, self.max_context, self.k, self.pools.conv.device)
        recapture = (oracle is None) != (self.oracle is None)
        self.oracle = oracle
        return recapture

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head.first_rows(hidden, self.draft_vocab).float()

    def verify(self, inp: RoundInputs, drafts: torch.Tensor, q: torch.Tensor | None, sampled: bool, k: int):
        """Steps 2-4 for drafts [B, k] (q [B, k, Vd]: their distributions, None when no row samples): returns
        (kept [B], tokens [B, k + 1], the verify's hidden states [B (k + 1), H])."""
        model, pools = self.model, self.pools
        B = inp.slots.shape[0]
        if self.oracle is not None:
            drafts = self.oracle.apply(drafts, inp, model.cfg.vocab_size)
        rows = self.rows.first(B, k + 1)
        batch = rows_batch(inp, 0, k + 1, pools.page_size, self.max_seq_len, verify=rows)
        hidden = model(torch.cat([inp.last[:, None], drafts], 1).reshape(-1), batch, pools)   # [B (k+1), H]
        logits = model.logits(hidden).view(B, k + 1, -1)
        kept, tokens = accept(drafts, logits, inp.sampling, q)
        kept = torch.where(inp.halted > 0, -1, cut_at_stop(kept, tokens, inp.stop))
        gdn_replay(pools.conv, pools.ssm, inp.slots, (kept + 1).int(), rows, *self.snapshot_rows(inp, k))
        return kept, tokens, hidden

    def snapshot_rows(self, inp: RoundInputs, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, slot) of each sequence's prefix-cache snapshot in a round of k drafts: the verify row that ends at the
        page boundary among its k + 1 rows, where the host gave a slot (row -1 and the scratch slot where none, or
        where the round is halted). The device decides, since a round launched before the host read the one before
        does not know its base on the host; the replay writes it only if that row is kept."""
        boundary = page_boundary(inp.base, k + 1, self.pools.page_size)
        take = (inp.snap_slots != self.scratch) & (boundary > inp.base) & (inp.halted == 0)
        rows = torch.where(take, boundary - inp.base - 1, -1).int()
        return rows, torch.where(take, inp.snap_slots, self.scratch)

    def outputs(self, inp: RoundInputs, kept: torch.Tensor, tokens: torch.Tensor) -> RoundOutputs:
        """A round's outputs with its carry (module docstring, step 6)."""
        last = torch.where(kept < 0, inp.last, tokens.gather(1, kept.clamp(min=0)[:, None])[:, 0])
        carry = torch.stack([inp.base + kept + 1, last, inp.sampling.steps + kept + 1,
                             ((inp.halted > 0) | (last == inp.stop)).long()])
        return RoundOutputs(kept, tokens, carry)

    def round(self, inp: RoundInputs, sampled: bool, k: int) -> RoundOutputs:
        """One speculative round of k drafts (1 .. self.k): each drafter's own."""
        raise NotImplementedError

    def first_draft(self, inp: RoundInputs, hidden: torch.Tensor) -> None:
        """After a prompt's first token is sampled (hidden: the main model's last hidden states): what the drafter
        needs before the first round (nothing, unless a drafter says otherwise)."""


class RoundRunner(Rounds):
    method = "mtp"

    def __init__(self, model: Qwen3_5Model, pools: CacheTensors, k: int, max_batch: int, max_context: int,
                 draft_vocab: int = EngineConfig.draft_vocab):
        """k: the most drafts a round makes (buffers are sized for it)."""
        assert model.mtp is not None
        super().__init__(model, pools, k, max_batch, max_context, draft_vocab)
        dev, dtype = pools.conv.device, pools.conv.dtype
        # per state slot (graph padding rows use the scratch slot: every slot has a row)
        self.draft_tokens = torch.zeros(pools.num_slots, dtype=torch.int64, device=dev)
        self.draft_hidden = torch.zeros(pools.num_slots, model.cfg.hidden_size, dtype=dtype, device=dev)

    # ---- outside rounds (eager) ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_mtp(self, hidden: torch.Tensor, next_ids: torch.Tensor, batch: ForwardBatch) -> None:
        """The MTP layer over a prefill step's rows (hidden [T, H], the token after each row in next_ids), for its
        KV: rows whose next token is not known yet (the prompt's last) must have slot_mapping -1."""
        self.model.mtp_forward(next_ids, hidden, batch, self.pools)

    @torch.inference_mode()
    def first_draft(self, inp: RoundInputs, hidden: torch.Tensor) -> None:
        """After a prompt's first token x_n is sampled: the MTP row at n - 1 (x_n with the main model's last hidden
        state) drafts d_1. inp.base holds n - 1 and inp.last x_n."""
        batch = rows_batch(inp, 0, 1, self.pools.page_size, self.max_seq_len)
        m = self.model.mtp_forward(inp.last, hidden, batch, self.pools)
        d1, _ = pick_draft(self.draft_logits(m), inp.sampling, 1, bool((inp.sampling.temperature > 0).any()))
        self.draft_tokens[inp.slots] = d1
        self.draft_hidden[inp.slots] = m

    # ---- one round ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def round(self, inp: RoundInputs, sampled: bool, k: int) -> RoundOutputs:
        """One speculative round of k drafts (1 .. self.k) for B = len(inp.slots) sequences (see the module
        docstring). sampled: some rows sample (else every row is greedy: no probabilities are made)."""
        assert 1 <= k <= self.k
        model, pools = self.model, self.pools
        page, B = pools.page_size, inp.slots.shape[0]
        s = inp.sampling
        d, h, qs = [self.draft_tokens[inp.slots]], self.draft_hidden[inp.slots], []
        if sampled:                               # q of d_1 was made last round from these logits
            qs.append(pick_draft(self.draft_logits(h), s, 1, True)[1])
        for j in range(1, k):                     # d_{j+1} from the MTP row at n + j - 1
            batch = rows_batch(inp, j - 1, 1, page, self.max_seq_len)
            h = model.mtp_forward(d[-1], h, batch, pools)
            token, q = pick_draft(self.draft_logits(h), s, j + 1, sampled)
            d.append(token)
            qs.append(q)
        kept, tokens, hidden = self.verify(inp, torch.stack(d, 1), torch.stack(qs, 1) if sampled else None,
                                           sampled, k)
        catch_up = rows_batch(inp, 0, k + 1, page, self.max_seq_len)
        m = model.mtp_forward(tokens.reshape(-1), hidden, catch_up, pools).view(B, k + 1, -1)
        m = m[torch.arange(B, device=m.device), kept]             # (a halted row's -1: its last row, unused)
        next_s = dataclasses.replace(s, steps=s.steps + kept + 1)
        self.draft_tokens[inp.slots] = pick_draft(self.draft_logits(m), next_s, 1, sampled)[0]
        self.draft_hidden[inp.slots] = m
        return self.outputs(inp, kept, tokens)


def page_boundary(base, rows: int, page: int):
    """The last page boundary a round's `rows` rows from `base` reach (base + rows, rounded down to a page): inside the
    rows when it is above base. base: an int (the host's) or a tensor (the device's): one rule for both."""
    return (base + rows) // page * page


def cut_at_stop(kept: torch.Tensor, tokens: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
    """kept [B] shortened so that a row's new tokens (tokens[:, :kept + 1]) end at the first `stop` among them: the
    tokens after it would have been drawn under rules that the stop token changes (a grammar that starts there).
    Taking fewer tokens of a round is exact: each one kept was drawn exactly as plain decoding draws it."""
    hit = tokens == stop[:, None]                                                     # stop -1 matches nothing
    first = torch.where(hit.any(1), hit.int().argmax(1), torch.full_like(kept, tokens.shape[1]))
    return torch.minimum(kept, first)


@dataclass
class RoundRequest:
    """What the host knows of one sequence for a round (lists become RoundInputs)."""
    slot: int
    base: int
    last: int
    pages: Sequence[int]          # a PageTable
    limit: int
    snap_slot: int                # the slot a snapshot at a page boundary inside the round goes to (scratch: none)
    sampling: SamplingRow = field(default_factory=SamplingRow)
    delta: int = 0
    stop: int = -1

    @classmethod
    def padding(cls, slot: int, temperature: float = 0.0) -> RoundRequest:
        """A row that writes nothing (limit 0) on `slot`: a batch padded to its bucket, or a graph's capture."""
        return cls(slot, 0, 0, [], 0, slot, SamplingRow(temperature))


CARRIED = 4     # the rows of round_inputs' int64 buffer a round takes from another's carry: base, last, steps, halted


def round_inputs(reqs: list[RoundRequest], max_pages: int, device, pad_to: int = 0, pad_slot: int = 0,
                 out: RoundInputs | None = None, carry: torch.Tensor | None = None) -> RoundInputs:
    """Host lists -> RoundInputs on the device (into `out`'s buffers when given: a graph's static inputs), padded to
    pad_to rows with rows that write nothing (limit 0) on pad_slot. carry: the outputs' carry [CARRIED, len(reqs)]
    of a round of the same sequences not yet read by the host; its rows replace the requests' base, last, sampling
    steps and halted (a device copy queued behind the upload). The fields are views of four buffers, one per
    dtype, each built in one call and uploaded in one copy from page-locked memory (no wait for the GPU): host work
    before a round's graph runs (16 tensors built and uploaded one by one took 112 us of a CPU core at 8 sequences,
    before any upload). Each view starts 16-byte aligned, as a tensor of its own would (Triton
    specializes a kernel on its pointers' alignment)."""
    n = len(reqs)
    pad = max(0, pad_to - n)
    reqs = reqs + [RoundRequest.padding(pad_slot)] * pad
    B, s = len(reqs), [r.sampling for r in reqs]
    fill8, fill4 = [0] * (_aligned(B, 8) - B), [0] * (_aligned(B, 4) - B)
    ints = [[r.base for r in reqs], [r.last for r in reqs], [x.steps for x in s], [0] * B, [r.slot for r in reqs],
            [r.limit for r in reqs], [r.snap_slot for r in reqs], [r.delta for r in reqs], [r.stop for r in reqs],
            [x.top_k for x in s], [x.seed for x in s]]
    tables = page_table([r.pages for r in reqs], max_pages).view(-1)
    host = (torch.tensor([row + fill8 for row in ints], dtype=torch.int64),
            torch.cat([tables, tables.new_zeros(_aligned(B * max_pages, 4) - B * max_pages)]),
            torch.tensor([[x.temperature for x in s] + fill4, [x.top_p for x in s] + fill4,
                          [x.min_p for x in s] + fill4], dtype=torch.float32),
            torch.tensor([x.seeded for x in s], dtype=torch.bool))
    if out is None:
        out = _views(tuple(pinned(t).to(device, non_blocking=True) for t in host), B, max_pages)
    else:
        for dst, src in zip(out.packs, host, strict=True):
            dst.copy_(pinned(src), non_blocking=True)
    if carry is not None:
        out.packs[0][:CARRIED, :n].copy_(carry)
    return out


def _aligned(n: int, itemsize: int) -> int:
    """n items of itemsize bytes, rounded up to a multiple of 16 bytes."""
    per = 16 // itemsize
    return -(-n // per) * per


def _views(packs: tuple[torch.Tensor, ...], B: int, max_pages: int) -> RoundInputs:
    """round_inputs' four buffers as RoundInputs (each field a contiguous view)."""
    ints, int32s, floats, seeded = (packs[0][:, :B], packs[1], packs[2][:, :B], packs[3])
    return RoundInputs(base=ints[0], last=ints[1], halted=ints[3], slots=ints[4],
                       block_tables=int32s[:B * max_pages].view(B, max_pages), limit=ints[5], snap_slots=ints[6],
                       delta=ints[7], stop=ints[8],
                       sampling=Sampling(temperature=floats[0], top_k=ints[9], top_p=floats[1], min_p=floats[2],
                                         seeds=ints[10], steps=ints[2], seeded=seeded),
                       packs=packs)


class RoundGraphs:
    """Speculative rounds captured per (batch bucket, drafts, greedy / sampled) over static inputs, and timed: all of
    them at load (engine/spec/speculation.py `capture`); running one that was not captured is a bug, not a capture on a
    request's path (that stalled every stream for seconds)."""

    def __init__(self, spec: Rounds, buckets: list[int], max_pages: int, scratch_slot: int, pool=None):
        self.spec, self.buckets, self.max_pages, self.scratch = spec, buckets, max_pages, scratch_slot
        self.pool = pool
        self.graphs: dict[tuple[int, int, bool], tuple] = {}
        self.seconds: dict[tuple[int, int, bool], float] = {}       # a replay's GPU time, at capture

    def capture(self, b: int, k: int, sampled: bool) -> None:
        dev = self.spec.pools.conv.device
        reqs = [RoundRequest.padding(self.scratch, temperature=0.5)] * b
        inp = round_inputs(reqs, self.max_pages, dev)
        for _ in range(2):                                   # compile, tune, initialise outside the capture
            self.spec.round(inp, sampled, k)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with capture_graph(graph, pool=self.pool):
            out = self.spec.round(inp, sampled, k)
        self.pool = graph.pool()
        self.graphs[(b, k, sampled)] = (graph, inp, out)
        self.seconds[(b, k, sampled)] = replay_seconds(graph)

    def clear(self) -> None:
        """Drop the captured rounds (and their memory pool: a pool whose graphs are gone cannot be captured into)."""
        self.graphs.clear()
        self.seconds.clear()
        self.pool = None

    def fits(self, n: int) -> bool:
        return n <= self.buckets[-1]

    def run(self, reqs: list[RoundRequest], k: int, sampled: bool, carry: torch.Tensor | None = None) -> RoundOutputs:
        """Replay the round of k drafts for these requests (carry: round_inputs'); its outputs are the graph's
        static buffers, which the next replay of the same graph overwrites."""
        n = len(reqs)
        b = next(x for x in self.buckets if x >= n)
        graph, inp, out = self.graphs[(b, k, sampled)]
        round_inputs(reqs, self.max_pages, inp.slots.device, pad_to=b, pad_slot=self.scratch, out=inp, carry=carry)
        graph.replay()
        return RoundOutputs(out.kept[:n], out.tokens[:n], out.carry[:, :n])


def replay_seconds(graph, replays: int = 3) -> float:
    """A captured graph's GPU time per replay (the median of a few, after one not timed)."""
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]
