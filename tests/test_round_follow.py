"""A round launched from the one in flight (engine/spec/speculation.py launch's `after`) on the tiny checkpoint (CPU,
fp32): the device decides each round's prefix-cache snapshot row from its own base; a halted row (its round before
ended at its stop token) changes nothing of its sequence; the engine launches most rounds that way and its output
stays plain decoding's, also through the graph layer's static buffers (a replay overwrites the outputs the round
before it left); a round whose rows pass a page boundary with no snapshot slot to be had drops the rolling snapshot,
which would else be promoted under a page it does not end."""

import pytest
import torch

import engine.core.build
import engine.core.runner
import engine.spec.speculation
from engine.api import Engine, EngineConfig, SamplingParams
from engine.bench.oracle import DraftOracle
from engine.core.sampling import SamplingRow
from engine.spec.rounds import CARRIED, RoundGraphs, RoundRequest, round_inputs
from tests.test_draft_policy import StubDecodeGraphs

GREEDY = dict(temperature=0.0, ignore_eos=True)
PAGE = 16


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("base"))


def make(ckpt, k, **kw):
    return Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", speculative_tokens=k, max_context=640,
                               page_size=PAGE, **kw))


def prompt(n, seed):
    return torch.randint(0, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def requests(e, bases, snap_slots):
    """Requests for live slots 0, 1, ..., each with pages from the free list for 64 tokens past its base."""
    cache = e._cache
    free = list(cache.free_pages)
    reqs = []
    for i, (base, snap) in enumerate(zip(bases, snap_slots)):
        pages = [free.pop() for _ in range(-(-(base + 64) // PAGE))]
        reqs.append(RoundRequest(slot=i, base=base, last=5 + i, pages=pages, limit=len(pages) * PAGE,
                                 snap_slot=snap if snap >= 0 else cache.scratch_slot, sampling=SamplingRow()))
    return reqs


def test_the_device_picks_the_snapshot_row_from_its_base(ckpt):
    e = make(ckpt, 3)
    try:
        rounds, scratch = e._spec.spec, e._cache.scratch_slot
        # bases against page boundaries at 16, 32: 13 + 4 rows reach 16 (row 2); 12's reach it only with its last
        # row (3); 11's do not; 30 has a slot but is halted; 28 has no slot
        reqs = requests(e, [13, 12, 11, 30, 28], [20, 21, 22, 23, -1])
        carry = torch.tensor([[13, 12, 11, 30, 28], [5, 6, 7, 8, 9], [0] * 5, [0, 0, 0, 1, 0]])
        inp = round_inputs(reqs, e._spec.max_pages, "cpu", carry=carry)
        rows, slots = rounds.snapshot_rows(inp, 3)
        assert rows.tolist() == [2, 3, -1, -1, -1]
        assert slots.tolist() == [20, 21, scratch, scratch, scratch]
    finally:
        e.close()


def test_a_halted_row_leaves_its_sequence_as_it_was(ckpt):
    """Two sequences; the second's round before ended at its stop token: this round keeps -1 for it, its GDN state
    stays (its KV rows past its tokens and its next draft are overwritten: only drafting reads them before they are
    written again), and its carry is its inputs again (still halted). The first one's round runs as usual."""
    e = make(ckpt, 3, profile="C2")
    try:
        rounds, pools = e._spec.spec, e._pools
        g = torch.Generator().manual_seed(0)
        for t in (pools.ssm, pools.conv):
            t[:, :2] = torch.randn(t[:, :2].shape, generator=g)
        before = [t[:, :2].clone() for t in (pools.ssm, pools.conv)]
        reqs = requests(e, [40, 50], [-1, -1])
        carry = torch.tensor([[40, 50], [7, 8], [3, 4], [0, 1]])
        out = rounds.round(round_inputs(reqs, e._spec.max_pages, "cpu", carry=carry), False, 3)
        assert out.kept[1].item() == -1 and out.kept[0].item() >= 0
        assert out.carry[:, 1].tolist() == [50, 8, 4, 1]
        n = out.kept[0].item() + 1
        assert out.carry[:, 0].tolist() == [40 + n, out.tokens[0, n - 1].item(), 3 + n, 0]
        after = [t[:, :2] for t in (pools.ssm, pools.conv)]
        for old, new in zip(before, after):
            assert torch.equal(new[:, 1], old[:, 1]) and not torch.equal(new[:, 0], old[:, 0])
        assert out.carry.shape == (CARRIED, 2)
    finally:
        e.close()


def test_the_engine_launches_rounds_from_the_one_in_flight(ckpt):
    """C4, prompts longer than a page, lengths that end the sequences at different rounds: most rounds start from
    the one in flight, and every output is plain decoding's."""
    prompts = [prompt(40 + 9 * i, 70 + i) for i in range(4)]
    lengths = [37, 50, 23, 61]
    plain = make(ckpt, 0, profile="C4")
    try:
        want = [plain.generate(p, SamplingParams(max_tokens=n, **GREEDY)).token_ids for p, n in zip(prompts, lengths)]
    finally:
        plain.close()
    e = make(ckpt, 3, profile="C4")
    try:
        e.set_draft_oracle(DraftOracle(0.8, {tuple(p): p + w for p, w in zip(prompts, want)}), adaptive=False)
        handles = [e.submit(p, SamplingParams(max_tokens=n, **GREEDY)) for p, n in zip(prompts, lengths)]
        assert [[t for ev in h for t in ev.token_ids] for h in handles] == want
        stats = e.stats()
        assert stats["spec_rounds_followed"] > stats["spec_rounds"] / 4 / 2, stats
        assert stats["kv_pages_used"] == 0 and stats["state_slots_used"] == 0
        held = e._cache.snapshots
        assert len(held._free) + len(held) == e._cache.scratch_slot - e.config.max_running   # no slot lost
    finally:
        e.close()


def test_a_page_passed_without_a_snapshot_slot_drops_the_rolling_one(ckpt):
    """Two to four snapshot slots for two sequences: rounds often find none free when their rows pass a page
    boundary. Every snapshot kept at the end is the state at its own page (the plain engine's there), none the
    state at an older one."""
    prompts = [prompt(37, 81), prompt(45, 82)]
    plain = make(ckpt, 0, profile="C2", snapshots=16)
    try:
        want = [plain.generate(p, SamplingParams(max_tokens=70, **GREEDY)).token_ids for p in prompts]
        plain_states = {key: plain._pools.ssm[:, slot].clone() for key, slot in plain._cache.snapshots._kept.items()}
    finally:
        plain.close()
    checked = 0
    for snapshots in (2, 3, 4):
        e = make(ckpt, 3, profile="C2", snapshots=snapshots)
        try:
            e.set_draft_oracle(DraftOracle(0.9, {tuple(p): p + w for p, w in zip(prompts, want)}), adaptive=False)
            handles = [e.submit(p, SamplingParams(max_tokens=70, **GREEDY)) for p in prompts]
            assert [[t for ev in h for t in ev.token_ids] for h in handles] == want
            for key, slot in e._cache.snapshots._kept.items():
                torch.testing.assert_close(e._pools.ssm[:, slot], plain_states[key], atol=1e-5, rtol=1e-5)
                checked += 1
        finally:
            e.close()
    assert checked


class EagerGraph:
    """A captured round as the GPU replays it: over the same static inputs, into the same static outputs."""

    def __init__(self, rounds, inp, sampled, k, out):
        self.rounds, self.inp, self.sampled, self.k, self.out = rounds, inp, sampled, k, out

    @torch.inference_mode()
    def replay(self):
        new = self.rounds.round(self.inp, self.sampled, self.k)
        for dst, src in ((self.out.kept, new.kept), (self.out.tokens, new.tokens), (self.out.carry, new.carry)):
            dst.copy_(src)


class EagerRoundGraphs(RoundGraphs):
    """RoundGraphs whose graphs run eagerly on the CPU, with the static buffers RoundGraphs.run writes and reads."""

    def capture(self, b, k, sampled):
        inp = round_inputs([RoundRequest.padding(self.scratch, temperature=0.5)] * b, self.max_pages, "cpu")
        out = self.spec.round(inp, sampled, k)
        self.graphs[(b, k, sampled)] = (EagerGraph(self.spec, inp, sampled, k, out), inp, out)
        self.seconds[(b, k, sampled)] = 5e-3 + 1e-4 * b * (k + 1)


def test_rounds_through_the_graph_layers_buffers(ckpt, monkeypatch):
    """C4 with the graph layer's static inputs and outputs: a round launched from the one in flight reads its carry
    out of the buffers the next replay overwrites, greedy and seeded sampling alike: output equal to plain."""
    monkeypatch.setattr(engine.core.build, "graphs_on", lambda device: True)
    monkeypatch.setattr(engine.core.runner, "DecodeGraphs", StubDecodeGraphs)
    monkeypatch.setattr(engine.spec.speculation, "RoundGraphs", EagerRoundGraphs)
    prompts = [prompt(30 + 11 * i, 90 + i) for i in range(4)]
    params = [SamplingParams(max_tokens=40 - 5 * i, **GREEDY) if i % 2 == 0 else
              SamplingParams(max_tokens=40 - 5 * i, temperature=0.8, top_p=0.9, seed=7 + i, ignore_eos=True)
              for i in range(4)]
    plain = make(ckpt, 0, profile="C4")
    try:
        want = [plain.generate(p, q).token_ids for p, q in zip(prompts, params)]
    finally:
        plain.close()
    e = make(ckpt, 3, profile="C4")
    try:
        assert isinstance(e._spec.graphs, EagerRoundGraphs)
        e.set_draft_oracle(DraftOracle(0.8, {tuple(p): p + w for p, w in zip(prompts, want)}), adaptive=False)
        handles = [e.submit(p, q) for p, q in zip(prompts, params)]
        assert [[t for ev in h for t in ev.token_ids] for h in handles] == want
        assert e.stats()["spec_rounds_followed"] > 4
    finally:
        e.close()
