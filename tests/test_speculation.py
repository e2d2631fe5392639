"""Speculative decoding through Engine on the tiny checkpoints (CPU, fp32): greedy output equal to plain decoding for
k = 1 .. 5 with drafts right at every rate (a DraftOracle stands in for a trained head), batched, with prefix hits,
int8 KV, int4 weights, stop strings and a thinking budget; the GDN state after a round equals the plain path's;
cancels give everything back; seeded sampling reproduces; and a head distilled from the model itself in the test
gets drafts accepted well above chance on its own; a request whose tool calls are constrained once opened (tool_choice
auto) speculates until the call opens, and the round ends there."""

import gc
import shutil
import weakref

import pytest
import torch

from engine.api import Constraint, Engine, EngineConfig, SamplingParams
from engine.bench.oracle import DraftOracle

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("base"))


def make(ckpt, k, **kw):
    kw.setdefault("max_context", 640)
    kw.setdefault("page_size", 16)
    return Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", speculative_tokens=k, **kw))


def prompt(n, seed):
    return torch.randint(0, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def plain(ckpt):
    e = make(ckpt, 0, profile="C4")
    yield e
    e.close()


def plain_run(plain, ids, n, **kw):
    return plain.generate(ids, SamplingParams(max_tokens=n, **GREEDY, **kw)).token_ids


def with_oracle(e, p, runs):
    """runs: {prompt tuple: its plain output}."""
    e.set_draft_oracle(DraftOracle(p, {tuple(ids): list(ids) + out for ids, out in runs.items()}))
    return e


def test_tool_auto_speculates_until_a_call_opens(ckpt, tmp_path):
    """The checkpoint's LM head row of <tool_call> copies (x 1.01) the row of its plain greedy run's 8th token, so
    the call opens there, mid-round. Rounds then stop at the <tool_call> they keep (drafts past it were verified
    without the grammar), and the call is made under it: output equal to plain decoding's, drafts right or not."""
    from safetensors.torch import load_file, save_file
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}}}]
    messages = [{"role": "user", "content": "call f please"}]
    e = make(ckpt, 0)
    ids = e.encode_prompt(messages, tools=tools, enable_thinking=False)
    free = e.generate(ids, SamplingParams(max_tokens=12, **GREEDY)).token_ids
    call_open = e.tokenizer.token_to_id("<tool_call>")
    e.close()
    steered = tmp_path / "steered"
    shutil.copytree(ckpt, steered)
    weights = load_file(steered / "model.safetensors")
    weights["lm_head.weight"][call_open] = weights["lm_head.weight"][free[7]] * 1.01
    save_file(weights, str(steered / "model.safetensors"), metadata={"format": "pt"})
    params = dict(max_tokens=60, temperature=0.0, constraint=Constraint(tools=tools))
    e = make(str(steered), 0)
    want = e.generate(ids, SamplingParams(**params), tools=tools)
    e.close()
    assert call_open in want.token_ids[3:] and want.finish_reason == "tool_calls"
    for p in (1.0, 0.0):
        e = with_oracle(make(str(steered), 3), p, {tuple(ids): want.token_ids})
        try:
            out = e.generate(ids, SamplingParams(**params), tools=tools)
            assert out.token_ids == want.token_ids and out.tool_calls == want.tool_calls
            assert out.usage.speculation.rounds > 0
        finally:
            e.close()


def test_a_grammar_active_from_the_first_token_beside_speculating_requests(ckpt, plain):
    """json_schema without thinking: the grammar masks from the first token (no trigger), so that request never
    speculates (nor does its batch, while it runs); its first draft is still made, and the other request's rounds
    start once it is done."""
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    other = prompt(50, 32)
    want_other = plain_run(plain, other, 30)
    e = make(ckpt, 0)
    json_ids = e.encode_prompt([{"role": "user", "content": "json please"}], enable_thinking=False)
    want = e.generate(json_ids, SamplingParams(max_tokens=6, temperature=0.0,
                                               constraint=Constraint(json_schema=schema))).token_ids
    e.close()
    e = with_oracle(make(ckpt, 3, profile="C2"), 1.0, {tuple(other): want_other})
    try:
        constrained = SamplingParams(max_tokens=6, temperature=0.0, constraint=Constraint(json_schema=schema))
        handles = [e.submit(json_ids, constrained), e.submit(other, SamplingParams(max_tokens=30, **GREEDY))]
        events = [list(h) for h in handles]
        assert all(evs[-1].finish_reason != "error" for evs in events), [evs[-1].error for evs in events]
        assert [[t for ev in evs for t in ev.token_ids] for evs in events] == [want, want_other]
        assert events[0][-1].usage.speculation is None and events[1][-1].usage.speculation.rounds > 0
    finally:
        e.close()


@pytest.mark.parametrize("k, p", [(1, 1.0), (2, 0.5), (3, 0.82), (4, 0.0), (5, 0.9)])
def test_greedy_equals_plain_for_every_k(ckpt, plain, k, p):
    ids = prompt(70, k)
    want = plain_run(plain, ids, 45)
    e = with_oracle(make(ckpt, k), p, {tuple(ids): want})
    try:
        out = e.generate(ids, SamplingParams(max_tokens=45, **GREEDY))
        assert out.token_ids == want
        spec = out.usage.speculation
        assert spec.rounds > 0 and spec.drafted == k * spec.rounds
        if p == 1.0:
            assert spec.tokens_per_round > k                # all but the last round keep every draft
        if p == 0.0:
            assert spec.accepted == 0
    finally:
        e.close()


def test_batched_with_prefix_hits_and_stop_strings(ckpt, plain):
    """Four requests at once (C4): two share a prefix with an earlier one; one stops at a string."""
    base = prompt(50, 11)
    prompts = [base + prompt(20, 12), base + prompt(9, 13), prompt(33, 14), prompt(80, 15)]
    runs = {tuple(ids): plain_run(plain, ids, 30) for ids in prompts}
    e = with_oracle(make(ckpt, 3, profile="C4"), 0.8, runs)
    try:
        first = e.generate(base + prompt(5, 16), SamplingParams(max_tokens=4, **GREEDY))
        assert first.finish_reason == "length"
        handles = [e.submit(ids, SamplingParams(max_tokens=30, **GREEDY)) for ids in prompts]
        outs = [[t for ev in h for t in ev.token_ids] for h in handles]
        assert outs == [runs[tuple(ids)] for ids in prompts]
        stop_text = e.tokenizer.decode(runs[tuple(prompts[2])][5:7])
        stopped = e.generate(prompts[2], SamplingParams(max_tokens=30, stop=[stop_text], **GREEDY))
        plain_stopped = plain.generate(prompts[2], SamplingParams(max_tokens=30, stop=[stop_text], **GREEDY))
        assert stopped.text == plain_stopped.text and stopped.finish_reason == "stop"
        assert e.stats()["prefix_hit_tokens"] > 0
    finally:
        e.close()


@pytest.mark.parametrize("kw", [dict(kv_dtype="int8"), dict(kv_dtype="k8v4"), dict(weights="int4", quant_group=64)])
def test_int8_kv_and_int4_weights(ckpt, kw):
    ids = prompt(40, 21)
    ref = make(ckpt, 0, **kw)
    try:
        want = plain_run(ref, ids, 25)
    finally:
        ref.close()
    e = with_oracle(make(ckpt, 3, **kw), 0.7, {tuple(ids): want})
    try:
        assert e.generate(ids, SamplingParams(max_tokens=25, **GREEDY)).token_ids == want
    finally:
        e.close()


def test_state_after_rounds_equals_the_plain_path(ckpt):
    """After a request that speculated, its end-of-turn snapshot (the GDN state at its last page boundary, taken
    inside a round) equals the plain engine's to a tight tolerance."""
    ids = prompt(37, 31)
    states = []
    for k in (0, 3):
        e = make(ckpt, k, snapshots=4)
        try:
            out = e.generate(ids, SamplingParams(max_tokens=60, **GREEDY)).token_ids
            if k:
                e.set_draft_oracle(DraftOracle(0.9, {tuple(ids): ids + out}))
                assert e.generate(ids, SamplingParams(max_tokens=60, **GREEDY)).token_ids == out
            cache = e._cache
            key = cache.snapshots._kept and next(reversed(cache.snapshots._kept))
            slot = cache.snapshots._kept[key]
            states.append((key, e._pools.ssm[:, slot].clone(), e._pools.conv[:, slot].clone()))
        finally:
            e.close()
    (key0, ssm0, conv0), (key1, ssm1, conv1) = states
    assert key0 == key1
    torch.testing.assert_close(ssm1, ssm0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv1, conv0, atol=1e-5, rtol=1e-5)    # projections of k + 1 rows vs 1: fp32 rounding


def test_thinking_budget_is_kept(ckpt, plain):
    """A thinking budget ends reasoning after as many tokens as without speculation (rounds stop before it)."""
    tok = plain.tokenizer
    if tok.think_start_id is None:
        pytest.skip("the tiny tokenizer has no <think>")
    ids = prompt(20, 41) + [tok.think_start_id]
    params = dict(max_tokens=40, thinking_budget=7)
    want = plain.generate(ids, SamplingParams(**params, **GREEDY))
    e = with_oracle(make(ckpt, 3), 0.9, {tuple(ids): want.token_ids})
    try:
        got = e.generate(ids, SamplingParams(**params, **GREEDY))
        assert got.token_ids == want.token_ids and got.reasoning == want.reasoning
    finally:
        e.close()


def test_cancels_give_everything_back(ckpt):
    """200 random requests, a third cancelled at random moments: pages, state slots and snapshot slots all back."""
    from tests.cancel_storm import cancel_storm
    e = with_oracle(make(ckpt, 3, profile="C4", max_queue=256), 0.7, {})
    try:
        s = cancel_storm(e, 200, 70)
        assert s["kv_pages_used"] == 0 and s["state_slots_used"] == 0, s
        held = e._cache.snapshots
        assert len(held._free) + len(held) == e._cache.scratch_slot - e.config.max_running   # no slot lost
    finally:
        e.close()


def test_a_closed_engine_holds_none_of_its_cache_or_speculation_memory(ckpt):
    """Closing gives the memory back while the Engine object lives on (the app, or the 24 GiB simulation's next
    scenario, plans the next engine's memory before the old one is collected)."""
    e = make(ckpt, 2)
    e.generate(prompt(20, 1), SamplingParams(max_tokens=8, **GREEDY))
    held = [weakref.ref(x) for x in (e._pools.k, e._spec, e._spec.spec)]
    e.close()
    gc.collect()
    assert [r() for r in held] == [None] * len(held)


def test_seeded_sampling_is_plain_seeded_sampling(ckpt, plain):
    """A seeded request speculates to exactly its plain output (and so reproduces, prefix hits or not)."""
    ids = prompt(30, 51)
    params = SamplingParams(max_tokens=30, temperature=0.8, top_p=0.9, top_k=50, seed=1234)
    want = plain.generate(ids, params).token_ids
    e = make(ckpt, 3)
    e.set_draft_oracle(None, adaptive=False)
    try:
        a, b = e.generate(ids, params), e.generate(ids, params)
        assert a.token_ids == want and b.token_ids == want and a.usage.speculation.rounds > 0
    finally:
        e.close()


def test_a_distilled_head_drafts_well_above_chance(tmp_path, checkpoint):
    """Fit a tiny checkpoint's MTP module to the model itself (its greedy token after next, 60 full-batch CPU
    steps on 12 continuations), then generate from other prompts: drafts kept far more often than chance (1 / vocab).
    The calm checkpoint: its greedy continuations settle into shared runs a small head can learn; the base one's are
    close to random and a head only memorises them."""
    from tests.mtp_distill import distill_mtp

    path = distill_mtp(str(checkpoint("calm128")), tmp_path / "distilled", steps=60)
    e = make(str(path), 2)
    e.set_draft_oracle(None, adaptive=False)         # its own drafts, every step (on a CPU rounds rarely pay)
    try:
        kept = drafted = 0
        for i in range(3):
            out = e.generate(prompt(24, 60 + i), SamplingParams(max_tokens=40, **GREEDY))
            kept += out.usage.speculation.accepted
            drafted += out.usage.speculation.drafted
        assert kept / drafted > 0.25, (kept, drafted)
    finally:
        e.close()


@pytest.mark.gpu
@pytest.mark.parametrize("profile, sampled", [("C1", False), ("C4", False), ("C4", True)])
def test_graphed_rounds_on_the_gpu(checkpoint, profile, sampled):
    """The CUDA-graph rounds (bf16): greedy output equal to the plain engine's, batched; sampled rounds run and a
    seeded one reproduces."""
    ckpt = str(checkpoint("calm128"))
    prompts = [prompt(n, 70 + n) for n in (40, 9, 66, 23)][:int(profile[1:])]
    mk = lambda k: Engine(EngineConfig(model=ckpt, device="cuda", profile=profile, max_context=512,  # noqa: E731
                                       speculative_tokens=k))
    params = SamplingParams(max_tokens=40, **GREEDY)
    with mk(0) as ref:
        want = [ref.generate(p, params).token_ids for p in prompts]
    with mk(3) as e:
        if sampled:
            s = SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, seed=7)
            e.set_draft_oracle(None, adaptive=False)
            a, b = e.generate(prompts[0], s), e.generate(prompts[0], s)
            assert a.token_ids == b.token_ids and a.usage.speculation.rounds > 0
            return
        e.set_draft_oracle(DraftOracle(0.8, {tuple(p): p + w for p, w in zip(prompts, want)}), adaptive=False)
        handles = [e.submit(p, params) for p in prompts]
        got = [[t for ev in h for t in ev.token_ids] for h in handles]
        assert got == want
        assert e.stats()["spec_tokens_per_round"] > 2.0
        assert e.stats()["spec_rounds_followed"] > 0        # rounds launched from the round in flight's carry


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["C1", "C4", "C8"])
def test_int4_rounds_leave_the_plain_states_bit_for_bit_gpu(checkpoint, profile):
    """With int4 weights (GEMV rows independent of the row count) a speculative round is exact to the bit, not just
    to the argmax: every end-of-turn snapshot (the GDN state and conv window at a page boundary, taken inside a
    round) equals the plain engine's. Greedy output equal to plain decoding alone would miss a last-bit difference.
    C8's rounds verify 32 rows (the mma GEMV's 4 column tiles against a plain step's one)."""
    ckpt = str(checkpoint("calm128"))
    prompts = [prompt(n, 90 + n) for n in (40, 9, 66, 23, 31, 52, 17, 70)][:int(profile[1:])]
    mk = lambda k: Engine(EngineConfig(model=ckpt, device="cuda", profile=profile, max_context=512,  # noqa: E731
                                       speculative_tokens=k, weights="int4", quant_group=64, snapshots=16))
    params = SamplingParams(max_tokens=60, **GREEDY)

    def run(k, want=None):
        """(outputs, {snapshot key: (GDN state, conv window)}) of an engine with k drafts (oracle drafts of want)."""
        with mk(k) as e:
            if want is not None:
                e.set_draft_oracle(DraftOracle(0.8, {tuple(p): p + w for p, w in zip(prompts, want)}),
                                   adaptive=False)
            handles = [e.submit(p, params) for p in prompts]
            got = [[t for ev in h for t in ev.token_ids] for h in handles]
            if want is not None:
                assert e.stats()["spec_tokens_per_round"] > 2.0 and e.stats()["spec_rounds_followed"] > 0
            return got, {key: (e._pools.ssm[:, slot].clone(), e._pools.conv[:, slot].clone())
                         for key, slot in e._cache.snapshots._kept.items()}

    want, plain = run(0)
    got, spec = run(3, want)
    assert got == want
    assert len(spec) >= len(prompts) and spec.keys() <= plain.keys(), (len(spec), len(plain))
    for key, (ssm, conv) in spec.items():
        assert torch.equal(ssm, plain[key][0]), (ssm != plain[key][0]).sum().item()
        assert torch.equal(conv, plain[key][1])
