"""ModelRunner: turns sequences into one packed forward pass and samples their next tokens.

On CUDA, decode steps (one new token per sequence) replay CUDA graphs captured per batch size
bucket (1, 2, 4, 8): a decode step is ~600 small kernels, which launched one by one from Python
would cost more than the step itself. Padding rows of a bucket write to a scratch state slot
and no KV slot, so they never touch a live sequence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.core.device import capture_graph, copy_behind, pinned
from engine.cache.pages import CacheTensors
from engine.model.batch import ForwardBatch, build_batch, page_table
from engine.model.qwen3_5 import Qwen3_5Model
from engine.core.params import TokenLogprob
from engine.core.sequence import Sequence
from engine.spec.rounds import RoundRunner, replay_seconds
from engine.core.sampling import Sampling, SamplingRow, penalties_of
from qwendesk_kernels.sampling import Penalties, sample, token_logprobs, token_mask

BUCKETS = (1, 2, 4, 8)


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes decode steps and speculative rounds are captured at (a batch runs padded to the next one)."""
    buckets = [b for b in BUCKETS if b <= max(BUCKETS[0], max_batch)]
    return buckets + [max_batch] if max_batch > buckets[-1] else buckets


@dataclass
class StepInFlight:
    """A decode step whose tokens, sampled on the device (ModelRunner.sample_on_device), are still there: the loop
    launches the next step from them before it reads them (EngineLoop._decode). Their copy to the host is queued
    right behind the step (engine/core/device.py copy_behind)."""
    seqs: list[Sequence]
    ids: torch.Tensor           # [N] int64, on the device
    host: torch.Tensor          # the same, arriving in page-locked host memory
    ready: torch.cuda.Event | None = None     # recorded after the copy (None on the CPU)

    @classmethod
    def launch(cls, seqs: list[Sequence], ids: torch.Tensor) -> StepInFlight:
        (host,), ready = copy_behind(ids)
        return cls(seqs, ids, host, ready)

    def tokens(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class ModelRunner:
    def __init__(self, model: Qwen3_5Model, pools: CacheTensors, device: torch.device, *, max_batch: int = 1,
                 max_context: int = 0, scratch_slot: int = -1, cuda_graphs: bool = False):
        self.model = model
        self.pools = pools
        self.device = device
        self.graphs: DecodeGraphs | None = None
        self.speculator: RoundRunner | None = None   # set by the engine when it speculates: prompts feed its MTP KV
        self.last_hidden: torch.Tensor | None = None  # a prefill step's hidden states at its logits rows
        if cuda_graphs:                             # (the engine decides: engine.core.device.graphs_on)
            self.graphs = DecodeGraphs(model, pools, device, max_batch, max_context, scratch_slot)

    @torch.inference_mode()
    def forward(self, seqs: list[Sequence], query_lens: list[int], all_logits: bool = False,
                snapshots: list[tuple[int, int]] | None = None, input_ids: torch.Tensor | None = None,
                prefill: bool = False) -> torch.Tensor:
        """Run the next query_lens[i] uncomputed tokens of each sequence; advance num_computed.
        Returns fp32 logits of each sequence's last row [N, V] (or of every row with all_logits).
        snapshots: per sequence (tokens, slot): also save the GDN state after that many of its rows (0: none).
        input_ids: the step's token ids already on the device (a decode step fed by the last step's sampling, whose
        tokens the host has not read yet); None: from the sequences' tokens. prefill: prompt rows (never graphed; with
        a speculator their MTP KV is made too, and the logits rows' hidden states are kept in last_hidden)."""
        if (self.graphs is not None and not prefill and not all_logits and not snapshots
                and self.graphs.fits(seqs, query_lens)):
            logits = self.graphs.run(seqs, input_ids)
        else:
            if input_ids is None:
                input_ids = torch.cat([torch.tensor(s.tokens[s.num_computed:s.num_computed + n], dtype=torch.int64)
                                       for s, n in zip(seqs, query_lens)]).to(self.device)
            images = {} if not any(s.images for s in seqs) else \
                dict(mrope=[s.images.mrope if s.images else None for s in seqs], **image_inputs(seqs, query_lens))
            batch = build_batch(query_lens, [s.num_computed for s in seqs], [s.state_slot for s in seqs],
                                [s.pages for s in seqs], self.pools.page_size, self.device,
                                last_only=not all_logits, snapshots=snapshots,
                                conv_width=self.model.cfg.conv_kernel, **images)
            hidden = self.model(input_ids, batch, self.pools)
            if prefill and self.speculator is not None:
                self._prompt_mtp(self.speculator, seqs, query_lens, hidden, batch)
            if batch.logits_rows is not None:
                hidden = hidden[batch.logits_rows]
            self.last_hidden = hidden if prefill else None
            logits = self.model.logits(hidden)
        for s, n in zip(seqs, query_lens):
            s.num_computed += n
            if s.images and s.image_embeds:        # embeddings whose rows are all computed now are dropped
                for k in [k for k in s.image_embeds if s.images.spans[k][1] <= s.num_computed]:
                    del s.image_embeds[k]
        return logits

    def _prompt_mtp(self, speculator: RoundRunner, seqs: list[Sequence], query_lens: list[int], hidden: torch.Tensor,
                    batch: ForwardBatch) -> None:
        """The MTP layer's KV for a prefill step's rows: row p takes the token after it, known for every prompt row
        but the last (made with the first sampled token: Speculation.start). One slice per sequence (a row loop here
        made a 128K prompt's prefill quadratic on the host)."""
        next_ids, known = [], []
        for s, n in zip(seqs, query_lens):
            after = s.tokens[s.num_computed + 1:s.num_computed + n + 1]       # the tokens after the step's rows
            next_ids.append(torch.tensor(after + [0] * (n - len(after)), dtype=torch.int64))
            known.append(torch.arange(n) < len(after))
        dev = hidden.device
        slots = torch.where(torch.cat(known).to(dev), batch.slot_mapping, -1)
        speculator.prompt_mtp(hidden, torch.cat(next_ids).to(dev),
                                   dataclasses.replace(batch, slot_mapping=slots, logits_rows=None, snapshot=None))

    @torch.inference_mode()
    def sample(self, seqs: list[Sequence], logits: torch.Tensor, mask: torch.Tensor | None = None) -> list[int]:
        """Pick each sequence's next token from its logits row (fp32 [N, V]); record logprobs if asked.
        mask: grammar masks (host int32 [N, words], engine/text/grammar.py), applied after the logits processors.
        A sequence whose logits processor fails, or that has no token left to pick, gets `error` set
        (and a meaningless token) instead of failing the whole batch."""
        dev, V = logits.device, logits.shape[-1]
        ps = [s.params for s in seqs]
        raw = logits
        if any(p.logits_processors for p in ps):
            logits = logits.clone()
            for i, s in enumerate(seqs):
                try:
                    for proc in s.params.logits_processors:
                        logits[i] = proc(s.output, logits[i])
                except Exception as e:  # the caller's code: end this request, not the batch
                    s.error = f"a logits processor failed: {type(e).__name__}: {e}"
                    logits[i] = 0.0
            for i in torch.nonzero(logits.amax(-1) == float("-inf")).flatten().tolist():
                seqs[i].error = "every token was excluded (logits processors / logit bias left nothing to sample)"
                logits[i] = 0.0
        if mask is not None:
            logits = token_mask(logits, pinned(mask).to(dev, non_blocking=True))
            for i in torch.nonzero(logits.amax(-1) == float("-inf")).flatten().tolist():
                seqs[i].error = "the grammar allows none of the tokens the logits processors left"
                logits[i] = 0.0
        ids = self.sample_on_device(seqs, logits, penalties=penalties_of(seqs, logits)).tolist()
        for i, s in enumerate(seqs):
            if s.forced:
                ids[i] = s.forced.popleft()
        want = [p.logprobs is not None for p in ps]
        if any(want):
            n = min(max(p.logprobs or 0 for p in ps), V)
            lp, top_v, top_i = (t.tolist() for t in token_logprobs(raw.contiguous(), torch.tensor(ids, device=dev), n))
            for i, s in enumerate(seqs):
                if want[i]:
                    k = s.params.logprobs
                    s.logprobs.append(TokenLogprob(ids[i], lp[i], list(zip(top_i[i][:k], top_v[i][:k]))))
        return ids

    @torch.inference_mode()
    def sample_on_device(self, seqs: list[Sequence], logits: torch.Tensor, ahead: int = 0,
                         penalties: Penalties | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The next token of each sequence [N] int64, on the logits' device, with no host sync: argmax when every
        one is greedy, else the Triton sampler (the same tokens as the torch references, which serve the CPU).
        ahead: tokens sampled before these that the outputs do not hold yet (the seeds' step counts them).
        mask: grammar masks (host int32 [N, words]): the tokens they leave out get -inf first."""
        ps = [s.params for s in seqs]
        if mask is not None:
            logits = token_mask(logits, pinned(mask).to(logits.device, non_blocking=True))
        if penalties is None and all(p.temperature == 0 for p in ps):
            return logits.argmax(-1)
        s = Sampling.of([SamplingRow.of(seq, ahead) for seq in seqs]).to(self.device)
        return sample(logits.contiguous(), s.temperature, s.top_k, s.top_p, s.min_p, s.seeds, s.steps, penalties)


def image_inputs(seqs: list[Sequence], query_lens: list[int]) -> dict:
    """build_batch's image_rows / image_embeds for a step running query_lens[i] tokens of each sequence: the rows of
    its images' tokens, taking their embeddings (Sequence.image_embeds, encoded before the step)."""
    rows, embeds = [], []
    for s, n in zip(seqs, query_lens):
        start, end, mine = s.num_computed, s.num_computed + n, list[int]()
        for k, (a, b) in enumerate(s.images.spans if s.images else ()):
            lo, hi = max(a, start), min(b, end)
            if lo < hi:
                mine += range(lo - start, hi - start)
                embeds.append(s.image_embeds[k][lo - a:hi - a])
        rows.append(mine)
    return dict(image_rows=rows, image_embeds=torch.cat(embeds) if embeds else None)


class DecodeGraphs:
    """Decode forward (+ logits) captured once per batch bucket over static input buffers."""

    def __init__(self, model, pools: CacheTensors, device, max_batch: int, max_context: int, scratch_slot: int):
        self.model, self.pools, self.device = model, pools, device
        self.page = pools.page_size
        self.max_pages = -(-max_context // self.page)
        self.scratch_slot = scratch_slot
        self.buckets = batch_buckets(max_batch)
        B = self.buckets[-1]
        i64 = dict(dtype=torch.int64, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        self.ids = torch.zeros(B, **i64)
        self.positions = torch.zeros(3, B, **i64)
        self.cu_seqlens = torch.arange(B + 1, **i32)
        self.seq_lens = torch.ones(B, **i32)
        self.has_state = torch.zeros(B, dtype=torch.bool, device=device)
        self.state_slots = torch.full((B,), scratch_slot, **i64)
        self.block_tables = torch.zeros(B, self.max_pages, **i32)
        self.slot_mapping = torch.full((B,), -1, **i64)
        self.graphs, self.logits = {}, {}
        self.seconds: dict[int, float] = {}     # a replay's GPU time per bucket, at capture
        self.max_context = max_context
        pool = None
        for b in reversed(self.buckets):          # largest first: the others reuse its memory pool
            batch = self._batch(b)
            with torch.inference_mode():
                for _ in range(2):                 # compile kernels, initialise their state
                    model.logits(model(self.ids[:b], batch, pools))
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with capture_graph(g, pool=pool):
                    self.logits[b] = model.logits(model(self.ids[:b], batch, pools))
            pool = g.pool()
            self.graphs[b] = g
            self.seconds[b] = replay_seconds(g)
        torch.cuda.synchronize()

    def _batch(self, b: int) -> ForwardBatch:
        return ForwardBatch(positions=self.positions[:, :b], cu_seqlens=self.cu_seqlens[:b + 1],
                            seq_lens=self.seq_lens[:b], has_state=self.has_state[:b],
                            state_slots=self.state_slots[:b], block_tables=self.block_tables[:b],
                            slot_mapping=self.slot_mapping[:b], logits_rows=None, decode_len=1,
                            max_seq_len=self.max_context)

    def fits(self, seqs, query_lens) -> bool:
        return len(seqs) <= self.buckets[-1] and all(n == 1 for n in query_lens) and \
            all(s.num_computed < self.max_context for s in seqs)

    def run(self, seqs: list[Sequence], input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the bucket's graph for these sequences (input_ids: their tokens on the device, else from the
        host). Inputs go up from page-locked memory: the host does not wait for a step still running."""
        n = len(seqs)
        b = next(x for x in self.buckets if x >= n)
        pad = b - n
        pos = [s.num_computed for s in seqs]
        slots = [s.pages[p // self.page] * self.page + p % self.page for s, p in zip(seqs, pos)]
        tables = page_table([s.pages for s in seqs] + [()] * pad, self.max_pages)
        if input_ids is None:
            self.ids[:b].copy_(pinned(torch.tensor([s.tokens[p] for s, p in zip(seqs, pos)] + [0] * pad)),
                               non_blocking=True)
        else:
            self.ids[:n].copy_(input_ids)
        state_slots = [s.state_slot for s in seqs] + [self.scratch_slot] * pad
        rotary = [p + s.position_delta for s, p in zip(seqs, pos)]
        for buf, host in ((self.positions[:, :b], torch.tensor([rotary + [0] * pad] * 3)),
                          (self.seq_lens[:b], torch.tensor([p + 1 for p in pos] + [1] * pad)),
                          (self.has_state[:b], torch.tensor([p > 0 for p in pos] + [False] * pad)),
                          (self.state_slots[:b], torch.tensor(state_slots)),
                          (self.slot_mapping[:b], torch.tensor(slots + [-1] * pad)),
                          (self.block_tables[:b], tables)):
            buf.copy_(pinned(host), non_blocking=True)
        self.graphs[b].replay()
        return self.logits[b][:n]
