"""How many drafts a round makes (engine/spec/policy.py), and that every round the engine can run is captured at load.

The policy alone, on step times shaped like the H100's (docs/performance.md, 2026-12-06: int4 27B, a plain C1 step
7.7 ms, a verify of 4 rows 1.16x; C8 rounds ~1.9x a C8 step): it drafts while drafts are kept, fewer where rounds cost
more, none when none are kept, and looks again at a growing interval. Then the engine on a tiny checkpoint (CPU): with
drafts always wrong, speculation turns itself off within a bounded number of rounds at every C; always right, it
stays on; and with a stub graph layer, every (batch bucket, drafts, greedy / sampled) round is captured while the
engine loads and none while requests run.
"""

import random

import pytest
import torch

import engine.core.build
import engine.core.runner
import engine.spec.speculation
from engine.api import Engine, EngineConfig, SamplingParams
from engine.spec.policy import PROBE_MAX, PROBE_MIN, DraftPolicy, context_class
from engine.bench.oracle import DraftOracle
from engine.spec.rounds import round_inputs

BUCKETS = [1, 2, 4, 8]
STEP = {1: 7.7e-3, 2: 7.9e-3, 4: 9.0e-3, 8: 11.9e-3}                  # plain steps (s)


def h100_like(max_k=3, verify_rows_cost=0.16):
    """Warm times: a round of k drafts costs a step x (1 + cost per extra verify row x k b) + k - 1 draft steps."""
    warm = {(0, b): t for b, t in STEP.items()}
    for b, t in STEP.items():
        for k in range(1, max_k + 1):
            warm[(k, b)] = t * (1 + verify_rows_cost / 3 * k * b ** 0.5) + (k - 1) * 0.23e-3 + 0.6e-3
    return DraftPolicy(max_k, BUCKETS, warm)


def feed(policy, n, context, kept_of, steps):
    """Run `steps` decode steps as the policy chooses; each round keeps kept_of(k) drafts per sequence and takes its
    estimated time. Returns the choices."""
    choices = []
    for _ in range(steps):
        k = policy.choose(n, context)
        choices.append(k)
        if k:
            policy.kept_drafts(k, [kept_of(k) for _ in range(n)])
        b = policy.bucket(n)
        policy.step_time(k, n, context, policy.estimate(k, b, context_class(context)))
    return choices


def test_the_oracle_expects_one_plus_the_running_products_of_its_rates():
    assert DraftOracle(0.5, {}).expected_tokens(3) == 1 + 0.5 + 0.25 + 0.125
    assert DraftOracle((0.9, 0.5), {}).expected_tokens(3) == pytest.approx(1 + 0.9 + 0.45 + 0.225)
    assert DraftOracle(0.82, {}).expected_tokens(0) == 1


def test_drafts_are_made_while_they_are_kept():
    policy = h100_like()
    assert set(feed(policy, 1, 512, lambda k: k, 50)) == {3}
    assert policy.rate(0) > 0.95


def test_no_drafts_kept_means_plain_steps_within_a_few_rounds_then_rare_probes():
    for n in (1, 2, 4, 8):
        policy = h100_like()
        choices = feed(policy, n, 512, lambda k: 0, 2000)
        first_plain = choices.index(0)
        assert first_plain <= 6, (n, choices[:10])
        rounds = sum(1 for k in choices[first_plain:] if k)
        assert rounds <= 8, (n, rounds)                   # probes at 16, 32, ... 512 plain steps
        assert all(k == 1 for k in choices[first_plain:] if k)            # the cheapest round probes
    assert policy.probe_every == PROBE_MAX


def test_probes_find_drafts_kept_again():
    policy = h100_like()
    feed(policy, 1, 512, lambda k: 0, 300)
    assert policy.probe_every > PROBE_MIN
    choices = feed(policy, 1, 512, lambda k: k, 600)
    assert choices[-50:] == [3] * 50 and policy.probe_every == PROBE_MIN


def test_fewer_drafts_where_a_round_costs_more():
    """Each draft kept half the time (when the ones before it were): worth two or three drafts at C1, where the
    verify's extra rows are cheap; at C8 with rows costing ten times as much, one draft at most."""
    rng = random.Random(0)

    def half(k):
        return next((j for j in range(k) if rng.random() >= 0.5), k)

    cheap = h100_like(verify_rows_cost=0.05)
    assert feed(cheap, 1, 512, half, 200)[-1] >= 2
    dear = h100_like(verify_rows_cost=0.5)
    assert feed(dear, 8, 512, half, 200)[-1] <= 1


def test_the_context_adds_to_every_estimate_at_its_batch():
    policy = h100_like()
    b, c = 1, context_class(131072)
    policy.step_time(3, 1, 131072, policy.warm[(3, 1)] + 4e-3)                    # 4 ms of KV reads at 128K
    assert policy.estimate(0, b, c) == pytest.approx(policy.warm[(0, 1)] + 4e-3)
    assert policy.estimate(0, b, context_class(262144)) == pytest.approx(policy.warm[(0, 1)] + 4e-3)
    assert policy.estimate(0, b, context_class(512)) == pytest.approx(policy.warm[(0, 1)])
    assert policy.estimate(0, 2, c) == pytest.approx(policy.warm[(0, 2)])         # another batch: not yet


def test_without_warm_times_plain_steps_are_probed_after_a_few_rounds():
    policy = DraftPolicy(3, BUCKETS)
    assert [policy.choose(1, 100) for _ in range(2)] == [3, 3]
    for _ in range(4):
        policy.step_time(3, 1, 100, 10e-3)
    assert policy.choose(1, 100) == 0
    policy.step_time(0, 1, 100, 4e-3)
    policy.kept_drafts(3, [0] * 20)
    assert policy.choose(1, 100) == 0                 # 1 token per 10 ms against 1 per 4 ms


# ---- the engine ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("base"))


def prompts_and_plain(ckpt, c, n):
    prompts = [torch.randint(0, 600, (40,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(c)]
    with Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile=f"C{c}", max_context=640,
                             page_size=16, speculative_tokens=0)) as plain:
        want = [plain.generate(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)).token_ids
                for p in prompts]
    return prompts, want


@pytest.mark.parametrize("c", [1, 2, 4, 8])
def test_speculation_turns_off_when_no_draft_is_kept_and_stays_on_when_all_are(ckpt, c, monkeypatch):
    """The engine's steps as they run, with the GPU's proportions for their times (on the CPU a tiny model's round
    costs ~3.4 plain steps, and the machine's load moves that: the choice would follow the noise): a plain step as
    in STEP, a round of k drafts 1.2 + 0.05 k of it."""
    real = engine.spec.speculation.Speculation.step_done

    def step_done(self, k, seqs, seconds):
        plain = STEP[self.policy.bucket(len(seqs))]
        real(self, k, seqs, plain * (1.2 + 0.05 * k) if k else plain)

    monkeypatch.setattr(engine.spec.speculation.Speculation, "step_done", step_done)
    n = 120
    prompts, want = prompts_and_plain(ckpt, c, n)
    runs = {tuple(p): p + w for p, w in zip(prompts, want)}
    for p in (0.0, 1.0):
        with Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile=f"C{c}", max_context=640,
                                 page_size=16, speculative_tokens=3)) as e:
            e.set_draft_oracle(DraftOracle(p, runs))
            handles = [e.submit(q, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)) for q in prompts]
            events = [list(h) for h in handles]
            assert [[t for ev in evs for t in ev.token_ids] for evs in events] == want
            fins = [evs[-1] for evs in events]
            rounds = [f.usage.speculation.rounds if f.usage.speculation else 0 for f in fins]
            by_drafts = e.stats()["spec_steps_by_drafts"]   # decode steps with 0 (plain), 1, 2, 3 drafts each
            if p == 0.0:
                assert max(rounds) <= 12, rounds            # 4 rounds, then plain steps and a probe per 16, 32, ...
                assert by_drafts[0] > 4 * sum(by_drafts[1:]), by_drafts
            else:
                assert min(rounds) >= (n - 8) // 4, rounds  # every step a round of 3 drafts, all kept
                assert by_drafts[3] >= (n - 8) // 4 and by_drafts[1] == by_drafts[2] == 0, by_drafts


class StubDecodeGraphs:
    """The plain decode graphs, not captured (the CPU has none): steps run eagerly; each bucket has a warm time."""

    def __init__(self, model, pools, device, max_batch, max_context, scratch_slot):
        self.buckets = engine.core.runner.batch_buckets(max_batch)
        self.seconds = {b: 5e-3 + 1e-4 * b for b in self.buckets}

    def fits(self, seqs, query_lens):
        return False


class StubRoundGraphs:
    """The graph layer of rounds: records each capture and each replay, and runs the round eagerly."""
    captured: list = []
    ran: list = []

    def __init__(self, spec, buckets, max_pages, scratch_slot):
        self.spec, self.buckets, self.max_pages, self.scratch = spec, buckets, max_pages, scratch_slot
        self.seconds = {}

    def capture(self, b, k, sampled):
        StubRoundGraphs.captured.append((b, k, sampled))
        self.seconds[(b, k, sampled)] = 5e-3 + 1e-4 * b * (k + 1)

    def clear(self):
        self.seconds.clear()

    def fits(self, n):
        return n <= self.buckets[-1]

    def run(self, reqs, k, sampled, carry=None):
        b = next(x for x in self.buckets if x >= len(reqs))
        assert (b, k, sampled) in self.seconds, "a round that was not captured at load"
        StubRoundGraphs.ran.append((b, k, sampled))
        return self.spec.round(round_inputs(reqs, self.max_pages, self.spec.pools.conv.device, carry=carry), sampled, k)


def test_every_round_is_captured_at_load_and_none_on_a_requests_path(ckpt, monkeypatch):
    monkeypatch.setattr(engine.core.build, "graphs_on", lambda device: True)
    monkeypatch.setattr(engine.core.runner, "DecodeGraphs", StubDecodeGraphs)
    monkeypatch.setattr(engine.spec.speculation, "RoundGraphs", StubRoundGraphs)
    StubRoundGraphs.captured, StubRoundGraphs.ran = [], []
    stages = []
    with Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile="C4", max_context=640, page_size=16,
                             speculative_tokens=3), progress=lambda stage, done, total: stages.append(stage)) as e:
        every = {(b, k, s) for b in (1, 2, 4) for k in (1, 2, 3) for s in (False, True)}
        assert sorted(StubRoundGraphs.captured) == sorted(every) and "Capturing speculative rounds" in stages
        assert e._spec.policy.warm[(0, 4)] == pytest.approx(5.4e-3) and (3, 4) in e._spec.policy.warm
        e._spec.adaptive = False                            # every step a round of 3 drafts
        prompts = [torch.randint(0, 600, (20 + 7 * i,), generator=torch.Generator().manual_seed(i)).tolist()
                   for i in range(4)]
        greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
        sampled = SamplingParams(max_tokens=20, temperature=0.8, seed=3, ignore_eos=True)
        for batch in ([prompts[0]], prompts[:2], prompts[:3], prompts):
            handles = [e.submit(p, greedy if i % 2 == 0 else sampled) for i, p in enumerate(batch)]
            for h in handles:
                assert [ev for ev in h][-1].finish_reason == "length"
        assert len(StubRoundGraphs.captured) == len(every)       # nothing captured after load
        assert {b for b, _, _ in StubRoundGraphs.ran} == {1, 2, 4} and {s for _, _, s in StubRoundGraphs.ran} == {
            False, True}


def test_a_verify_stays_within_the_rows_that_keep_it_exact(ckpt, monkeypatch):
    """exact_verify_rows bounds a round's verify (bucket x (k + 1) rows): rounds past it are neither captured nor run,
    with the policy or without (here 8 rows: C4 rounds make 1 draft, C1 and C2 up to 3)."""
    monkeypatch.setattr(engine.core.build, "graphs_on", lambda device: True)
    monkeypatch.setattr(engine.core.build, "exact_verify_rows", lambda weights, device: 8)
    monkeypatch.setattr(engine.core.runner, "DecodeGraphs", StubDecodeGraphs)
    monkeypatch.setattr(engine.spec.speculation, "RoundGraphs", StubRoundGraphs)
    StubRoundGraphs.captured, StubRoundGraphs.ran = [], []
    with Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile="C4", max_context=640, page_size=16,
                             speculative_tokens=3)) as e:
        every = {(b, k, s) for b in (1, 2) for k in (1, 2, 3) for s in (False, True)} | {
            (4, 1, False), (4, 1, True)}
        assert sorted(StubRoundGraphs.captured) == sorted(every)
        assert e._spec.most == {1: 3, 2: 3, 4: 1}
        assert all(e._spec.policy.choose(4, 100) <= 1 for _ in range(20))
        e._spec.adaptive = False                            # every step the most drafts its bucket may make
        prompts = [torch.randint(0, 600, (20 + 7 * i,), generator=torch.Generator().manual_seed(i)).tolist()
                   for i in range(4)]
        handles = [e.submit(p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)) for p in prompts]
        for h in handles:
            assert [ev for ev in h][-1].finish_reason == "length"
        assert {(b, k) for b, k, _ in StubRoundGraphs.ran} <= {(1, 3), (2, 3), (4, 1)} and (4, 1) in {
            (b, k) for b, k, _ in StubRoundGraphs.ran}


def test_exact_verify_rows_is_the_int4_gemvs_on_cuda():
    from qwendesk_kernels.gemv_mma import GEMV_MMA_MAX_M
    rows = engine.spec.speculation.exact_verify_rows
    assert rows("int4", torch.device("cuda")) == GEMV_MMA_MAX_M == 32
    assert rows("bf16", torch.device("cuda")) is None and rows("int4", torch.device("cpu")) is None


@pytest.mark.gpu
def test_on_the_gpu_every_round_graph_exists_after_load_and_requests_capture_none(ckpt, monkeypatch):
    """The real graph layer: after load every (bucket, k, greedy / sampled) round is captured and timed; requests at
    each batch size then replay them, capturing nothing, and greedy output equals the plain engine's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    config = dict(model=ckpt, device="cuda", profile="C4", max_context=640, page_size=16)
    prompts = [torch.randint(0, 600, (20 + 7 * i,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(4)]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    with Engine(EngineConfig(**config, speculative_tokens=0)) as plain:
        want = [plain.generate(p, greedy).token_ids for p in prompts]
    with Engine(EngineConfig(**config, speculative_tokens=3)) as e:
        graphs = e._spec.graphs
        every = {(b, k, s) for b in (1, 2, 4) for k in (1, 2, 3) for s in (False, True)}
        assert set(graphs.graphs) == every and set(graphs.seconds) == every
        assert all(t > 0 for t in graphs.seconds.values())
        e.set_draft_oracle(DraftOracle(0.8, {tuple(p): p + w for p, w in zip(prompts, want)}), adaptive=False)
        assert set(graphs.graphs) == every                  # captured again with the oracle's kernels in them
        captures = []
        monkeypatch.setattr(type(graphs), "capture", lambda self, *a: captures.append(a))
        for n in (1, 2, 3, 4):
            handles = [e.submit(p, greedy) for p in prompts[:n]]
            assert [[t for ev in h for t in ev.token_ids] for h in handles] == want[:n]
        assert captures == [] and e.stats()["spec_rounds"] > 0
