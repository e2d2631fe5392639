"""The block drafter (DFlash / DFlash2) in the engine, on tiny checkpoints (CPU, fp32): the paged drafter (context K /
V in the engine's pages, written by the target's forwards; a block per sequence) equals the one-sequence drafter that
tests/test_dflash.py checks against the reference; greedy output with the drafter equals plain decoding, alone and
batched, with drafts right at every rate (a DraftOracle), int8 KV, stop strings, seeded sampling; a prefix hit, from
the GPU pages or the host tier, restores the drafter's context (the same drafts as a cold run); cancels give every page
back; a drafter made for another model is refused in one line before anything loads; the plan counts it; a thinking
budget is kept, and image rows enter the drafter's context as text rows do."""

import json

from pathlib import Path

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams, plan_for
from engine.bench.oracle import DraftOracle
from engine.bench.random_model import text_config
from engine.cache.kv_format import KVFormat
from engine.cache.pages import CacheTensors
from engine.model.block_drafter import BlockDrafter, DraftBlocks, drafter_from_state, ring_slots, ring_table
from engine.model.dflash import Drafter
from engine.model.linear import Build
from engine.model.drafter_config import DrafterMismatch, parse_drafter_config
from tests.fixtures.drafters import drafter_config, write_drafter

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return checkpoint("base")


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def drafter(request, ckpt, tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp(request.param), ckpt, request.param, seed=1)


def make(ckpt, drafter=None, k=5, **kw):
    kw.setdefault("max_context", 640)
    kw.setdefault("page_size", 16)
    return Engine(EngineConfig(model=str(ckpt), device="cpu", dtype="float32", speculative_tokens=k if drafter else 0,
                               drafter=str(drafter) if drafter else None, **kw))


def prompt(n, seed):
    return torch.randint(0, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def plain(ckpt):
    e = make(ckpt, profile="C4")
    yield e
    e.close()


def run(e, ids, n, **kw):
    return e.generate(ids, SamplingParams(max_tokens=n, **{**GREEDY, **kw})).token_ids


# ---- the paged drafter against the one-sequence one ------------------------------------------------------------------

def paged_pools(cfg, num_pages: int, page_size: int, kv: KVFormat, num_slots: int = 2) -> CacheTensors:
    """Pools of a tiny target (one layer of each kind) beside `kv`, with the drafter's."""
    from engine.model.config import parse_model_config
    target = parse_model_config({**text_config("tiny"), "num_hidden_layers": 2, "full_attention_interval": 2})
    return CacheTensors.allocate(target, num_pages, page_size, num_slots, torch.float32, "cpu", kv=kv, drafter=cfg)


def engine_drafter(raw: dict, seed: int = 0) -> tuple[Drafter, BlockDrafter]:
    """A tiny random drafter as the reference modules and as the engine holds them (fp32, CPU), norm weights and
    DFlash2's kernels not at their initial values."""
    cfg = parse_drafter_config(raw)
    torch.manual_seed(seed)
    ref = Drafter(cfg).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "base_kernel" in name:
                p.normal_(0, 0.3)
            elif name.endswith("norm.weight"):
                p.normal_(1, 0.2)
    return ref, drafter_from_state(cfg, Build(torch.float32, "cpu"), ref.state_dict())


class Placed:
    """Sequences i = 0, 1 .. on shuffled pages, sequence i in state slot i: where the target's forwards write a
    position's context (its KV slot, its ring slot) and where a block sits (DraftBlocks)."""

    def __init__(self, pools: CacheTensors, pages_each: int, sequences: int = 2):
        self.pools, self.page = pools, pools.page_size
        order = torch.randperm(sequences * pages_each, generator=torch.Generator().manual_seed(2))
        self.tables = order.view(sequences, pages_each).int()

    def slots(self, i: int, pos: torch.Tensor) -> torch.Tensor:
        return self.tables[i, pos // self.page].long() * self.page + pos % self.page

    def rings(self, i: int, pos: torch.Tensor, slots: torch.Tensor) -> torch.Tensor | None:
        ring = self.pools.ring_tokens
        return ring_slots(torch.full_like(pos, i), pos, slots, ring) if ring else None

    def write(self, drafter: BlockDrafter, i: int, features: torch.Tensor, start: int = 0, step: int = 7) -> None:
        """Sequence i's context from `start` on, a step of `step` rows at a time, as the target's forwards write it."""
        for a in range(0, features.shape[0], step):
            pos = start + torch.arange(a, min(a + step, features.shape[0]))
            slots = self.slots(i, pos)
            drafter.write_context(features[pos - start], pos, slots, self.rings(i, pos, slots), self.pools)

    def blocks(self, lengths: list[int], block: int, max_seq_len: int) -> DraftBlocks:
        """Each sequence's block at its next `block` positions, all of them with pages."""
        slots = torch.cat([self.slots(i, n + torch.arange(block)) for i, n in enumerate(lengths)])
        where = DraftBlocks(tables=self.tables, seq_lens=torch.tensor(lengths, dtype=torch.int32) + block,
                            slots=slots, block=block, max_seq_len=max_seq_len)
        if self.pools.ring_tokens:
            pos = torch.cat([n + torch.arange(block) for n in lengths])
            state = torch.arange(len(lengths)).repeat_interleave(block)
            where.ring_slots = ring_slots(state, pos, slots, self.pools.ring_tokens)
            where.ring_tables = ring_table(torch.arange(len(lengths)), self.tables.shape[1], self.pools.ring_tokens,
                                           self.page)
        return where


@pytest.mark.parametrize("variant,page_size,window,kv", [("dflash", 4, 5, "bf16"), ("dflash2", 4, 5, "bf16"),
                                                         ("dflash", 1, 3, "bf16"), ("dflash2", 8, 64, "bf16"),
                                                         ("dflash", 4, 5, "k4v4"), ("dflash2", 8, 64, "int8")])
def test_the_paged_drafter_equals_the_one_sequence_drafter(variant, page_size, window, kv):
    """Two sequences on shuffled pages, their context written as the target's forwards write it (7 rows a step), one
    block each: the engine's drafter gives the same hidden states as the reference's Drafter.forward over a
    DrafterCache, sliding windows included (windows shorter than a page, than the block, longer than the context; the
    ring of a 5-key window wraps twice over the 41-token sequence); beside a quantized KV format the drafter's
    context is int8 (within its rounding)."""
    raw = drafter_config({"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4}, variant, block=4,
                         taps=(0, 1, 3), window=window)
    ref, drafter = engine_drafter(raw)
    cfg = ref.cfg
    lengths, B, pages_each = [41, 6], cfg.block_size, 48 // page_size
    pools = paged_pools(cfg, 2 * pages_each, page_size, KVFormat(kv))
    assert (pools.draft_k.dtype == torch.int8) == (kv != "bf16")
    assert pools.ring_tokens == (-(-(window + B) // page_size) + 1) * page_size
    placed = Placed(pools, pages_each)
    feats = [torch.randn(n, 3 * cfg.hidden_size) for n in lengths]
    blocks = [torch.randn(B, cfg.hidden_size) for _ in lengths]
    with torch.no_grad():
        for i, f in enumerate(feats):
            placed.write(drafter, i, f)
        index = torch.cat([n + torch.arange(B) for n in lengths])
        got = drafter.draft(torch.cat(blocks), index, placed.blocks(lengths, B, 48), pools).view(2, B, -1)
        for i, (f, block) in enumerate(zip(feats, blocks)):
            cache = ref.new_cache()
            ref.extend(cache, f)
            tol = 1e-5 if kv == "bf16" else 3e-2
            torch.testing.assert_close(got[i], ref(block, cache), atol=tol, rtol=tol)


def test_only_the_full_layers_context_is_paged_and_a_ring_is_part_of_a_slots_state():
    """The sliding-window layer's context lives in a ring per state slot: the pages carry the full layer's only,
    and copy_state / read_state / write_state carry the ring (so snapshots, prefix hits and the tiers do); a slot's
    ring moved to another slot drafts there as it did in the first."""
    raw = drafter_config({"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4}, "dflash", block=4,
                         taps=(0, 1, 3), window=5)
    ref, drafter = engine_drafter(raw)
    pools = paged_pools(ref.cfg, 24, 4, KVFormat.BF16, num_slots=3)
    assert pools.draft_k.shape[0] == 1 and pools.ring_k.shape[:3] == (1, 3, 16)
    assert "ring_k" in pools.layout() and pools.snapshot_tail == 16 - 5 + 1
    placed = Placed(pools, 12)
    with torch.no_grad():
        placed.write(drafter, 0, torch.randn(30, 96))
        block = torch.randn(4, 32)
        before = drafter.draft(block, torch.arange(30, 34), placed.blocks([30], 4, 48), pools)
        state = pools.read_state(0)
        pools.ring_k[:, 0].zero_()
        pools.ring_v[:, 0].zero_()
        pools.write_state(2, state)                  # slot 0's state, through bytes, into slot 2
        pools.copy_state(2, 1)                       # then into slot 1
        pages = placed.tables[:, :8].tolist()        # sequence 1: a copy of sequence 0's pages, state slot 1
        pools.write_pages(pages[1], pools.read_pages(pages[0]))
        after = drafter.draft(block.repeat(2, 1), torch.arange(30, 34).repeat(2), placed.blocks([30, 30], 4, 48),
                              pools).view(2, 4, -1)
    assert not torch.allclose(after[0], before)      # slot 0's ring is gone
    torch.testing.assert_close(after[1], before)


def test_a_block_past_the_end_of_its_pages_reads_only_keys_with_k_v():
    """At the end of a sequence's room its block's last rows have no slot: the block then sits at the last positions
    that have pages, and no row reads a slot nothing was written to (the pools are NaN elsewhere)."""
    raw = drafter_config({"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4}, "dflash", block=4,
                         taps=(0, 1, 3), window=5)
    ref, drafter = engine_drafter(raw)
    pools = paged_pools(ref.cfg, 4, 4, KVFormat.BF16, num_slots=1)
    for t in (pools.draft_k, pools.draft_v, pools.ring_k, pools.ring_v):
        t.fill_(float("nan"))
    tables = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    slots = tables[0].long().repeat_interleave(4) * 4 + torch.arange(4).repeat(4)          # position p -> slot
    zero = torch.zeros(16, dtype=torch.long)
    rings = ring_slots(zero, torch.arange(16), slots, pools.ring_tokens)
    with torch.no_grad():
        drafter.write_context(torch.randn(14, 96), torch.arange(14), slots[:14], rings[:14], pools)
        where = DraftBlocks(tables=tables, seq_lens=torch.tensor([16], dtype=torch.int32),
                            slots=torch.cat([slots[14:], torch.tensor([-1, -1])]), block=4, max_seq_len=16,
                            ring_slots=torch.cat([rings[14:], torch.tensor([-1, -1])]),
                            ring_tables=ring_table(zero[:1], 4, pools.ring_tokens, 4))
        out = drafter.draft(torch.randn(4, 32), torch.arange(14, 18), where, pools)
    assert torch.isfinite(out).all()


# ---- through the engine ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 0.8, 1.0])
def test_greedy_output_equals_plain_alone_and_batched(ckpt, drafter, plain, p):
    prompts = [prompt(30 + 7 * i, 10 + i) for i in range(3)]
    want = [run(plain, ids, 40) for ids in prompts]
    e = make(ckpt, drafter, profile="C4")
    try:
        e.set_draft_oracle(DraftOracle(p, {tuple(ids): ids + out for ids, out in zip(prompts, want)}),
                           adaptive=False)
        assert run(e, prompts[0], 40) == want[0]
        handles = [e.submit(ids, SamplingParams(max_tokens=40, **GREEDY)) for ids in prompts]
        assert [[t for ev in h for t in ev.token_ids] for h in handles] == want
        s = e.stats()
        assert s["spec_method"] == "dflash" and s["spec_rounds"] > 0
        if p == 1.0:                  # every draft right: 6 tokens a round, the last rounds cut by max_tokens
            assert s["spec_tokens_per_round"] > 4.5
    finally:
        e.close()


def test_int8_kv_stop_strings_and_seeded_sampling_equal_plain(ckpt, drafter):
    ids = prompt(33, 5)
    outs = {}
    for name, d in (("plain", None), ("drafter", drafter)):
        e = make(ckpt, d, kv_dtype="int8")
        try:
            greedy = e.generate(ids, SamplingParams(max_tokens=30, **GREEDY))
            seeded = e.generate(ids, SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=7,
                                                    ignore_eos=True))
            text = e.tokenizer.decode(greedy.token_ids)
            stop = text[len(text) // 2:len(text) // 2 + 3]
            stopped = e.generate(ids, SamplingParams(max_tokens=30, stop=[stop], **GREEDY))
            outs[name] = (greedy.token_ids, seeded.token_ids, stopped.text, stopped.finish_reason)
        finally:
            e.close()
    assert outs["drafter"] == outs["plain"]


class Recorder:
    """A DraftHook that keeps every round's drafts as they came from the drafter (and changes none)."""

    def __init__(self):
        self.drafts = []

    def attach(self, previous, slots, max_context, k, device):
        pass

    def assign(self, slot, prompt):
        pass

    def apply(self, drafts, inp, vocab):
        self.drafts.append(drafts.tolist())
        return drafts


def test_a_prefix_hit_restores_the_drafter_context_from_pages_and_the_host_tier(ckpt, drafter):
    """A second request over the same 64-token prefix (4 pages) reads the drafter's context from the cached pages and
    the snapshot taken in passing (the sliding layer's ring, copied after the step): its drafts equal a cold engine's,
    round for round; and again after the pages and the snapshot went to the host tier and came back. The request
    computes one token past the hit, so its first blocks see the window before the boundary."""
    ids = prompt(65, 9)

    def drafts_of(e, ids):
        rec = Recorder()
        e.set_draft_oracle(rec, adaptive=False)
        out = run(e, ids, 12)
        return out, rec.drafts

    cold = make(ckpt, drafter)
    try:
        want = drafts_of(cold, ids)
    finally:
        cold.close()
    e = make(ckpt, drafter, host_cache_gb=0.01)
    try:
        run(e, ids[:64] + [1, 2, 3, 4, 5, 6], 4)                    # caches the shared pages, a snapshot at 64
        assert drafts_of(e, ids) == want
        assert e.stats()["prefix_hit_tokens"] >= 64
        for n in range(8):                                           # other prompts push the pages to the host tier
            run(e, prompt(600, 100 + n), 1)
        hits = e.stats()["host_hit_pages"]
        assert drafts_of(e, ids) == want
        assert e.stats()["host_hit_pages"] >= hits + 4
    finally:
        e.close()


def test_the_next_turn_hits_the_snapshot_a_round_took_with_the_drafters_rings(ckpt, drafter):
    """A reply decoded in rounds passes page boundaries mid-round: its end-of-turn snapshot is a round's (the GDN state
    by the verify's replay, the rings copied after the round, which still hold the window before the boundary). The
    next turn, over the conversation to one token past it, hits it: its drafts equal a cold engine's, round for
    round."""
    ids = prompt(37, 13)

    def drafts_of(e, ids):
        rec = Recorder()
        e.set_draft_oracle(rec, adaptive=False)
        return run(e, ids, 10), rec.drafts

    e = make(ckpt, drafter)
    try:
        e.set_draft_oracle(Recorder(), adaptive=False)
        turn = (ids + run(e, ids, 44))[:81]          # the reply passes 48, 64 and 80 in rounds; one token past 80
        hits = e.stats()["prefix_hit_tokens"]
        got = drafts_of(e, turn)
        assert e.stats()["prefix_hit_tokens"] - hits == 80    # the last boundary the reply passed
    finally:
        e.close()
    cold = make(ckpt, drafter)
    try:
        assert got == drafts_of(cold, turn)
    finally:
        cold.close()


def test_cancels_mid_round_give_every_page_and_slot_back(ckpt, drafter):
    """60 random requests, a third cancelled at random moments while rounds run: pages and state slots all back."""
    from tests.cancel_storm import cancel_storm
    e = make(ckpt, drafter, profile="C4", max_queue=64)
    e.set_draft_oracle(DraftOracle(0.7, {}), adaptive=False)
    try:
        s = cancel_storm(e, 60, 20)
        assert s["kv_pages_used"] == 0 and s["state_slots_used"] == 0 and s["spec_rounds"] > 0, s
    finally:
        e.close()


def test_a_drafter_for_another_model_is_refused_before_loading(ckpt, tmp_path):
    other = write_drafter(tmp_path / "other", ckpt)
    raw = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**raw, "hidden_size": 48}))
    config = EngineConfig(model=str(ckpt), device="cpu", dtype="float32", speculative_tokens=3, drafter=str(other))
    with pytest.raises(DrafterMismatch, match="hidden size 48") as err:
        plan_for(config)
    assert "\n" not in str(err.value)
    with pytest.raises(DrafterMismatch):
        Engine(config)
    with pytest.raises(ValueError, match="needs a drafter"):
        EngineConfig(model=str(ckpt), speculation="dflash").validate()


def test_the_plan_counts_the_drafter(ckpt, drafter):
    """Its full layer's context K / V in each token's bytes (and no MTP layer's), its sliding layer's ring in each
    state slot's, as the engine's pools hold them; its weights in the engine's."""
    from engine.core.memory import kv_bytes_per_token
    from engine.model.config import load_model_config
    base = EngineConfig(model=str(ckpt), device="cpu", dtype="float32", speculative_tokens=3, max_context=512,
                        page_size=16)
    mtp, dflash = plan_for(base), plan_for(EngineConfig(**{**base.__dict__, "drafter": str(drafter)}))
    cfg = parse_drafter_config(json.loads((drafter / "config.json").read_text()))
    target = load_model_config(str(ckpt))
    assert mtp.kv_bytes_per_token == kv_bytes_per_token(target, torch.float32, mtp=True)
    assert cfg.ring_layers == (True, False)
    per_token = 2 * cfg.num_kv_heads * cfg.head_dim * 4                     # K and V of one layer, fp32
    assert dflash.kv_bytes_per_token == kv_bytes_per_token(target, torch.float32, mtp=False) + per_token
    assert dflash.state_bytes_per_slot == mtp.state_bytes_per_slot + cfg.ring_tokens(16) * per_token
    e = make(ckpt, drafter, k=3, max_context=512)
    try:
        assert e.plan().kv_bytes_per_token == dflash.kv_bytes_per_token and e.drafts == 3
        assert e.plan().state_bytes_per_slot == dflash.state_bytes_per_slot
        pools = e._pools
        assert pools.state_nbytes == dflash.state_bytes_per_slot and pools.ring_tokens == cfg.ring_tokens(16) == 32
        assert pools.page_nbytes == 16 * dflash.kv_bytes_per_token
        assert e._model.mtp is None and e._model.drafter is not None
        n_params = sum(p.numel() for p in Drafter(cfg).parameters())
        assert sum(p.numel() for p in e._model.drafter.parameters()) == n_params
        from engine.model.drafter_config import drafter_parameters
        assert drafter_parameters(cfg) == n_params
    finally:
        e.close()


@pytest.mark.gpu
@pytest.mark.parametrize("variant, profile, block", [("dflash", "C1", 16), ("dflash2", "C4", 8), ("dflash", "C4", 16)])
def test_graphed_block_rounds_on_the_gpu(checkpoint, tmp_path, variant, profile, block):
    """The CUDA-graph block rounds (bf16; 16-row blocks: up to 15 drafts, 16 verify rows a sequence): greedy output
    equal to the plain engine's, batched, drafts right at 0.8; a seeded sampled request reproduces. (The attention's
    row tiles, for more rows x heads than 64, are checked on the GPU at the 27B's shape in test_kernels_attention.)"""
    ckpt = checkpoint("calm128")
    drafter = write_drafter(tmp_path / variant, ckpt, variant, head_dim=32, block=block)
    prompts = [prompt(n, 70 + n) for n in (40, 9, 66, 23)][:int(profile[1:])]

    def mk(d):
        return Engine(EngineConfig(model=str(ckpt), device="cuda", profile=profile, max_context=512,
                                   speculative_tokens=block - 1 if d else 0, drafter=str(d) if d else None))

    params = SamplingParams(max_tokens=40, **GREEDY)
    with mk(None) as ref:
        want = [ref.generate(p, params).token_ids for p in prompts]
    with mk(drafter) as e:
        assert e.stats()["spec_method"] == "dflash"
        e.set_draft_oracle(DraftOracle(0.8, {tuple(p): p + w for p, w in zip(prompts, want)}), adaptive=False)
        handles = [e.submit(p, params) for p in prompts]
        assert [[t for ev in h for t in ev.token_ids] for h in handles] == want
        assert e.stats()["spec_tokens_per_round"] > 2.0
        e.set_draft_oracle(None, adaptive=False)
        s = SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, seed=7)
        a, b = e.generate(prompts[0], s), e.generate(prompts[0], s)
        assert a.token_ids == b.token_ids and a.usage.speculation.rounds > 0


def test_a_distilled_drafter_drafts_well_above_chance_through_the_engine(checkpoint, tmp_path):
    """Fit a tiny drafter (sliding windows of 8 included) to the calm checkpoint's own greedy continuations of 12
    prompts, from the tapped features its forward makes (30 full-batch CPU steps), then generate through
    Engine.generate with 5 drafts a round: on those prompts nearly every draft is kept (only a drafter whose context
    the engine builds at the right positions from the right layers, windows exact, gets there: a window 15 keys too
    wide kept 15%); on other prompts far more than chance (1 / vocab)."""
    from tests.drafter_distill import distill_drafter
    from tests.mtp_distill import _sequences

    ckpt = checkpoint("calm128")
    path = distill_drafter(str(ckpt), tmp_path / "distilled", steps=30)
    e = make(ckpt, path)
    e.set_draft_oracle(None, adaptive=False)         # its own drafts, every step (on a CPU rounds rarely pay)

    def rate(prompts):
        kept = drafted = 0
        for ids in prompts:
            out = e.generate(ids, SamplingParams(max_tokens=40, **GREEDY))
            kept += out.usage.speculation.accepted
            drafted += out.usage.speculation.drafted
        return kept / drafted

    try:
        assert rate([s[:16] for s in _sequences(str(ckpt), n=12, prompt_len=16, new=1)[:3]]) > 0.6
        assert rate([prompt(24, 60 + i) for i in range(3)]) > 0.03
    finally:
        e.close()


def test_int4_weights_quantize_the_drafter_too_and_stay_exact(ckpt, drafter):
    """With int4 weights the drafter's projections are int4 where the policy makes the model's int4 (those whose K is
    whole groups: only fc in this tiny one), the plan prices exactly those, and greedy output equals the plain int4
    engine's."""
    from engine.model.drafter_config import drafter_tensor_shapes
    from engine.model.linear import Linear
    from engine.weights.policy import policy_bytes
    ids = prompt(37, 21)
    with make(ckpt, weights="int4") as plain4:
        want = run(plain4, ids, 30)
    config = EngineConfig(model=str(ckpt), device="cpu", dtype="float32", speculative_tokens=5, drafter=str(drafter),
                          weights="int4", max_context=640, page_size=16)
    e = Engine(config)
    try:
        cfg, policy = e._model.drafter.cfg, config.policy("int4")
        shapes = drafter_tensor_shapes(cfg)
        held = {name for m in e._model.drafter.modules() if isinstance(m, Linear) and m.scheme == "int4"
                for name, *_ in m.checkpoint_slices()}
        assert held == {n for n, (shape, _) in shapes.items() if policy.scheme(n, shape) == "int4"} != set()
        without = plan_for(EngineConfig(**{**config.__dict__, "drafter": None, "speculative_tokens": 0}))
        assert plan_for(config).weights_bytes - without.weights_bytes == policy_bytes(shapes, policy)["total"]
        e.set_draft_oracle(DraftOracle(0.8, {tuple(ids): ids + want}), adaptive=False)
        assert run(e, ids, 30) == want
    finally:
        e.close()


def test_a_drafter_converts_to_int4_once_then_loads_from_the_conversion_cache(ckpt, drafter, tmp_path, monkeypatch):
    """The drafter's int4 conversion is cached on disk as the model's is: the second load reads it back (its stage
    says so) and holds the same weights."""
    from engine.core.params import EngineConfig
    from engine.model.block_drafter import load_drafter
    from engine.model.config import load_model_config
    from engine.model.linear import Linear
    monkeypatch.setenv("QWENDESK_CACHE_DIR", str(tmp_path / "cache"))
    policy, target = EngineConfig(model=str(ckpt)).policy("int4"), load_model_config(ckpt)
    loads, stages = [], []
    for _ in range(2):
        seen: set[str] = set()
        loads.append(load_drafter(drafter, target, "cpu", torch.float32, policy,
                                  lambda stage, done, total, seen=seen: seen.add(stage)))
        stages.append(seen)
    assert stages == [{"Converting weights to int4 (first load)"}, {"Loading int4 weights from the cache"}]
    first, second = ({n: m for n, m in d.named_modules() if isinstance(m, Linear) and m.scheme == "int4"}
                     for d in loads)
    assert first.keys() == second.keys() != set()
    for name in first:
        assert torch.equal(first[name].qweight, second[name].qweight)
        assert torch.equal(first[name].scales, second[name].scales)
    for (n, a), (_, b) in zip(loads[0].named_parameters(), loads[1].named_parameters()):
        assert torch.equal(a, b), n


def test_a_drafter_checkpoint_missing_a_tensor_is_refused_in_one_line(ckpt, drafter, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from engine.model.block_drafter import load_drafter
    from engine.model.config import load_model_config
    broken = Path(shutil.copytree(drafter, tmp_path / "broken"))
    state = load_file(str(broken / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "layers.0.mlp.up_proj.weight"}, str(broken / "model.safetensors"))
    with pytest.raises(DrafterMismatch, match="lacks 1 tensor") as err:
        load_drafter(broken, load_model_config(ckpt), "cpu", torch.float32)
    assert "\n" not in str(err.value) and "up_proj" in str(err.value)


def test_a_model_with_a_drafter_attached_takes_more_drafts_than_mtp(ckpt, drafter):
    """Engine.from_model (the benchmarks' way: the drafter attached to the model, no folder in the config) allows
    the block drafter's draft counts, capped to its block."""
    from engine.model.block_drafter import load_drafter
    from engine.model.load import load_model
    from engine.text.tokenizer import Tokenizer
    model, _ = load_model(ckpt, dtype=torch.float32)
    model.attach_drafter(load_drafter(drafter, model.cfg, "cpu", torch.float32))
    config = EngineConfig(model=str(ckpt), device="cpu", dtype="float32", speculative_tokens=7)
    with pytest.raises(ValueError, match="between 0 and 5"):
        config.validate()                   # no drafter named: the MTP head's limit
    with Engine.from_model(config, model, Tokenizer.from_checkpoint(ckpt)) as e:
        assert e.drafts == model.drafter.cfg.block_size - 1 == 5


def test_the_27b_drafter_is_planned_at_under_a_third_of_its_16_bit_bytes_with_int4_weights():
    from engine.bench.random_model import drafter_config
    from engine.model.drafter_config import drafter_parameters, drafter_tensor_shapes
    from engine.weights.policy import DEFAULT_POLICY, policy_bytes
    cfg = parse_drafter_config(drafter_config("27b"))
    n = drafter_parameters(cfg)
    assert 1.70e9 < n < 1.76e9                                  # ~1.73 B, as published
    assert policy_bytes(drafter_tensor_shapes(cfg), DEFAULT_POLICY)["total"] < 2 * n / 3.5


def test_the_27b_with_its_drafter_plans_128k_tokens_of_int8_kv_on_a_24gib_card(tmp_path):
    """Issue 45's plan: the 27B int4, its DFlash drafter (4 sliding layers of 2,048 in rings, one full layer paged)
    and the tower on demand, C1, on a headless 24 GiB card: at least 128K tokens of int8 KV (before the rings: 122,752);
    with kv_dtype auto the native 262,144."""
    from engine.bench.random_model import drafter_config
    from engine.core.memory import GIB
    from tests.test_kv_formats import qwen27b_on
    (tmp_path / "config.json").write_text(json.dumps(drafter_config("27b")))
    cfg, card = qwen27b_on(23.5)
    int8 = plan_for(EngineConfig(model="", profile="C1", kv_dtype="int8", drafter=str(tmp_path)), card, model=cfg)
    assert int8.method == "dflash" and int8.weights == "int4" and int8.vision == "on_demand", int8.summary()
    assert int8.fits and int8.max_context >= 128 * 1024 and int8.total_bytes <= 23.5 * GIB, int8.summary()
    auto = plan_for(EngineConfig(model="", profile="C1", kv_dtype="auto", drafter=str(tmp_path)), card, model=cfg)
    assert auto.method == "dflash" and auto.kv_dtype == "k4v4" and auto.max_context == 262144, auto.summary()


def test_auto_drafts_with_the_drafter_where_it_fits_else_with_the_mtp_head(ckpt, drafter):
    """speculation "auto": the smallest budget the drafter's plan fits in gets the drafter; one between that and the
    MTP plan's smallest gets the MTP head, and the engine built on such a plan loads and drafts with MTP; asking for
    "dflash" there is refused with what would fit."""
    import dataclasses

    base = EngineConfig(model=str(ckpt), device="cpu", dtype="float32", speculative_tokens=3, max_context=512,
                        snapshots=0, drafter=str(drafter))

    def smallest(config):
        lo, hi = 1, 1 << 34
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if plan_for(config, budget_bytes=mid).fits else (mid + 1, hi)
        return lo

    asked = dataclasses.replace(base, speculation="dflash")
    need_drafter, need_mtp = smallest(asked), smallest(dataclasses.replace(base, drafter=None))
    assert need_drafter > need_mtp
    assert plan_for(base, budget_bytes=need_drafter).method == "dflash"
    between = plan_for(base, budget_bytes=(need_drafter + need_mtp) // 2)
    assert between.fits and between.method == "mtp" and between.drafts == 3
    budget_gb = (need_drafter + need_mtp) // 2 / (1 << 30)
    with Engine(dataclasses.replace(base, gpu_memory_gb=budget_gb, page_size=16)) as e:
        assert e._model.drafter is None and e._model.mtp is not None
        assert e.stats()["spec_method"] == "mtp" and e.plan().method == "mtp"
    assert not plan_for(asked, budget_bytes=need_mtp).fits
    assert "block drafter" in plan_for(base, budget_bytes=need_drafter).summary()


def test_a_16_row_block_drafts_15_tokens_a_round_and_stays_exact(ckpt, plain, tmp_path):
    """A drafter of 16-row blocks (DFlash's own size) makes up to 15 drafts a round, verified in one forward of 16
    rows a sequence: drafts all right, 16 tokens a round; output equal to plain decoding, batched. More drafts than
    that are refused in one line, as more than 5 are with the MTP head."""
    drafter = write_drafter(tmp_path / "b16", ckpt, "dflash", block=16)
    prompts = [prompt(30 + 5 * i, 40 + i) for i in range(2)]
    want = [run(plain, ids, 64) for ids in prompts]
    e = make(ckpt, drafter, k=15, profile="C2")
    try:
        e.set_draft_oracle(DraftOracle(1.0, {tuple(ids): ids + out for ids, out in zip(prompts, want)}),
                           adaptive=False)
        handles = [e.submit(ids, SamplingParams(max_tokens=64, **GREEDY)) for ids in prompts]
        assert [[t for ev in h for t in ev.token_ids] for h in handles] == want
        assert e.drafts == 15 and e.stats()["spec_tokens_per_round"] > 12
    finally:
        e.close()
    with pytest.raises(ValueError, match="between 0 and 15 with a block drafter"):
        EngineConfig(model=str(ckpt), speculative_tokens=16, drafter=str(drafter)).validate()
    with pytest.raises(ValueError, match="between 0 and 5, not 6"):
        EngineConfig(model=str(ckpt), speculative_tokens=6).validate()
    with make(ckpt, write_drafter(tmp_path / "b6", ckpt), k=15) as small:      # a 6-row block drafts 5 at most
        assert small.drafts == 5


def test_a_thinking_budget_is_kept_with_the_drafter(ckpt, drafter, plain):
    """Reasoning ends after as many tokens as without speculation: a block round stops before the budget."""
    tok = plain.tokenizer
    if tok.think_start_id is None:
        pytest.skip("the tiny tokenizer has no <think>")
    ids = prompt(20, 41) + [tok.think_start_id]
    params = SamplingParams(max_tokens=40, thinking_budget=7, **GREEDY)
    want = plain.generate(ids, params)
    with make(ckpt, drafter) as e:
        e.set_draft_oracle(DraftOracle(0.9, {tuple(ids): ids + want.token_ids}), adaptive=False)
        got = e.generate(ids, params)
    assert got.token_ids == want.token_ids and got.reasoning == want.reasoning
    assert got.usage.speculation.rounds > 0


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_images_with_the_drafter_equal_plain_greedy(checkpoint, tmp_path, variant):
    """A vision checkpoint's drafter: the prompt's image rows enter its context through the target's forwards like
    any other (prefill steps of 16 tokens split the images), and rounds after them give plain greedy output."""
    from tests.test_vision_engine import SEVERAL, prompt_of
    target = checkpoint("gqa3_ratio3")
    path = write_drafter(tmp_path / variant, target, variant, seed=3)
    params = SamplingParams(max_tokens=24, **GREEDY)
    with make(target, max_context=1024, prefill_chunk=16) as e:
        want = e.generate(SEVERAL, params).token_ids
    with make(target, path, max_context=1024, prefill_chunk=16) as e:
        ids, _ = prompt_of(e, SEVERAL)
        e.set_draft_oracle(DraftOracle(0.8, {tuple(ids): ids + want}), adaptive=False)
        got = e.generate(SEVERAL, params)
    assert got.token_ids == want
    assert got.usage.speculation.method == "dflash" and got.usage.speculation.accepted > 0
