"""Speculative rounds with a block drafter (DFlash / DFlash2: engine/model/dflash.py), exact.

A round, for B sequences at once, on the device with no host sync (graphed as the MTP's rounds are: RoundGraphs):
  1. draft: one forward of the drafter over each sequence's block [x_n, MASK x (block - 1)] at positions n ..; its
     rows 1 .. k through the draft head (the first `draft_vocab` rows of the target's LM head) are the drafts: the
     argmax (or a draw) of each row (DFlash), or the candidate selector's left-to-right pick (DFlash2)
  2-4. verify, acceptance and the GDN replay, as for MTP (engine/spec/rounds.py Rounds.verify).
There is no catch-up and nothing kept between rounds: the target's forwards (prefill, plain steps, the verify) write
the drafter's context K / V of every row they compute, at the rows' own KV slots; the verify rows past the kept ones
hold context of rejected tokens until the next round's block and verify write over them.
"""

from __future__ import annotations

import torch

from engine.cache.pages import CacheTensors
from engine.model.block_drafter import DraftBlocks, ring_slots, ring_table
from engine.model.qwen3_5 import Qwen3_5Model
from engine.spec.acceptance import draft_probs, draw_draft
from engine.spec.rounds import RoundInputs, RoundOutputs, Rounds, rows_batch


class BlockRoundRunner(Rounds):
    method = "dflash"

    def __init__(self, model: Qwen3_5Model, pools: CacheTensors, k: int, max_batch: int, max_context: int,
                 draft_vocab: int):
        """k: the most drafts a round makes (below the drafter's block size)."""
        drafter = model.drafter
        assert drafter is not None and pools.draft_rings, "the model has no drafter, or the pools none of its KV"
        self.block = drafter.cfg.block_size
        assert 1 <= k < self.block, f"a block of {self.block} rows drafts at most {self.block - 1} tokens"
        super().__init__(model, pools, k, max_batch, max_context, draft_vocab)
        self.drafter = drafter

    def reach_of(self, k: int) -> int:
        return self.block             # the block's own K / V are written at its rows

    def draft_counts(self) -> list[int]:
        """Up to 5 every count, then steps (each count is captured: per bucket and greedy / sampled)."""
        return sorted(k for k in {1, 2, 3, 4, 5, 7, 10, 15, self.k} if k <= self.k)

    @torch.inference_mode()
    def round(self, inp: RoundInputs, sampled: bool, k: int) -> RoundOutputs:
        """One speculative round of k drafts (1 .. self.k) for B = len(inp.slots) sequences (see the module
        docstring). sampled: some rows sample (else every row is greedy: no probabilities are made)."""
        assert 1 <= k <= self.k
        hidden, logits = self.draft_rows(inp, k)
        drafts, q = self.pick(hidden, logits, inp, sampled)
        kept, tokens, _ = self.verify(inp, drafts, q, sampled, k)
        return self.outputs(inp, kept, tokens)

    def draft_rows(self, inp: RoundInputs, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's forward over every sequence's block: (hidden [B, k, H], draft logits [B, k, Vd] fp32) of
        rows 1 .. k."""
        model, drafter, n = self.model, self.drafter, self.block
        B = inp.slots.shape[0]
        batch = rows_batch(inp, 0, n, self.pools.page_size, self.max_seq_len)
        ids = torch.cat([inp.last[:, None], torch.full((B, n - 1), drafter.cfg.mask_token_id, dtype=inp.last.dtype,
                                                       device=inp.last.device)], 1)
        x = model.embed_tokens(ids.reshape(-1))
        if drafter.cfg.embedding_scale != 1.0:
            x = x * drafter.cfg.embedding_scale
        ends = torch.minimum(inp.base + n, inp.limit).clamp(min=1).int()
        blocks = DraftBlocks(tables=inp.block_tables, seq_lens=ends, slots=batch.slot_mapping, block=n,
                             max_seq_len=self.max_seq_len)
        ring = self.pools.ring_tokens
        if ring:
            positions = inp.base[:, None] + torch.arange(n, device=inp.base.device)
            blocks.ring_slots = ring_slots(inp.slots[:, None], positions, batch.slot_mapping.view(B, n),
                                           ring).reshape(-1)
            blocks.ring_tables = ring_table(inp.slots, inp.block_tables.shape[1], ring, self.pools.page_size)
        hidden = drafter.draft(x, batch.positions[0], blocks, self.pools).view(B, n, -1)[:, 1:k + 1]
        return hidden, drafter.logits(hidden, self.draft_logits)

    def pick(self, hidden: torch.Tensor, logits: torch.Tensor, inp: RoundInputs, sampled: bool):
        """Drafts [B, k] from the rows' draft logits, and their distributions q [B, k, Vd] (None: no row samples)."""
        s, selector = inp.sampling, self.drafter.candidate_selector
        if selector is None:
            greedy = logits.argmax(-1)
            if not sampled:
                return greedy, None
            q = torch.stack([draft_probs(logits[:, j], s) for j in range(logits.shape[1])], 1)
            drafts = torch.stack([draw_draft(q[:, j], s, j + 1, greedy[:, j]) for j in range(q.shape[1])], 1)
            return drafts, q
        # DFlash2: left to right, each row's candidates scored given the draft before it
        unary, candidates, projected = selector.candidates(hidden, logits)
        previous, drafts, qs = inp.last, [], []
        for j in range(logits.shape[1]):
            scores = selector.scores(unary[:, j], candidates[:, j], projected[:, j], previous)
            token = candidates[:, j].gather(1, scores.argmax(-1, keepdim=True))[:, 0]
            if sampled:
                t = s.temperature.clamp(min=1e-6)[:, None]
                q = torch.zeros_like(logits[:, j]).scatter(1, candidates[:, j], torch.softmax(scores / t, -1))
                token = draw_draft(q, s, j + 1, token)
                qs.append(q)
            drafts.append(token)
            previous = token
        return torch.stack(drafts, 1), torch.stack(qs, 1) if sampled else None
