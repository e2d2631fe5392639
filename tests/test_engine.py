"""Engine core on the CPU with a tiny checkpoint: batching, prefix reuse, cancel, queue limits,
seeded sampling, stop strings, streaming events."""

import random
import threading
import time

import pytest
import torch

from engine.api import ContextLengthError, Engine, EngineConfig, QueueFullError, SamplingParams


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("gqa3_ratio3"))


def make(ckpt, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("dtype", "float32")
    return Engine(EngineConfig(model=ckpt, **kw))


@pytest.fixture(scope="module")
def eng(ckpt):
    e = make(ckpt, profile="C4", max_context=1024)
    yield e
    e.close()


def prompt(n, seed):
    return torch.randint(0, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


GREEDY = dict(temperature=0.0, ignore_eos=True, logprobs=0)


def assert_idle(e):
    deadline = time.time() + 5
    while time.time() < deadline:
        s = e.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            break
        time.sleep(0.01)
    s = e.stats()
    assert s["kv_pages_used"] == 0 and s["state_slots_used"] == 0, s


def test_batched_equals_alone(ckpt, eng):
    lens = [5, 70, 33, 130, 1, 64]
    news = [12, 3, 20, 7, 9, 16]
    handles = [eng.submit(prompt(n, i), SamplingParams(max_tokens=m, **GREEDY))
               for i, (n, m) in enumerate(zip(lens, news))]
    batched = [[t for ev in h for t in ev.token_ids] for h in handles]
    alone_engine = make(ckpt, profile="C1", max_context=1024)
    try:
        for i, (n, m) in enumerate(zip(lens, news)):
            alone = alone_engine.generate(prompt(n, i), SamplingParams(max_tokens=m, **GREEDY)).token_ids
            assert batched[i] == alone, f"request {i}"
    finally:
        alone_engine.close()
    assert_idle(eng)


@pytest.mark.parametrize("system_repeats", [10, 40])
def test_prefix_hit_equals_cold(ckpt, eng, monkeypatch, system_repeats):
    """A short first prompt (< 512 tokens) snapshots its GDN state in passing, in one prefill step; a long one
    stops at the snapshot boundary and copies the state. Either way the second turn equals a cold run."""
    chat = [{"role": "system", "content": "You are terse. " * system_repeats},
            {"role": "user", "content": "First question, a long one: " + "words " * 60}]
    params = SamplingParams(max_tokens=10, **GREEDY)
    steps = []
    forward = eng._runner.forward
    monkeypatch.setattr(eng._runner, "forward", lambda seqs, lens, *a, **kw: steps.append((lens, kw.get("snapshots")))
                        or forward(seqs, lens, *a, **kw))
    first = eng.generate(chat, params, enable_thinking=False)
    monkeypatch.undo()
    prefill = [(lens, snaps) for lens, snaps in steps if lens != [1]]
    if first.usage.prompt_tokens <= 512:
        assert len(prefill) == 1 and prefill[0][1] is not None, prefill
    else:
        assert len(prefill) >= 2 and all(snaps is None for _, snaps in prefill), prefill
    assert first.usage.cached_tokens == 0
    turn2 = chat + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    warm = eng.generate(turn2, params, enable_thinking=False)
    assert warm.usage.cached_tokens >= 64, "the second turn must reuse the first turn's prompt"
    cold_engine = make(ckpt, profile="C1", max_context=1024)
    try:
        cold = cold_engine.generate(turn2, params, enable_thinking=False)
    finally:
        cold_engine.close()
    assert cold.usage.cached_tokens == 0
    assert warm.token_ids == cold.token_ids
    diff = max(abs(a.logprob - b.logprob) for a, b in zip(warm.logprobs, cold.logprobs))
    assert diff < 1e-4
    assert eng.stats()["prefix_hit_tokens"] >= warm.usage.cached_tokens
    assert_idle(eng)


def test_identical_prompt_reuses_end_of_turn_snapshot(eng):
    p = prompt(200, 99)
    a = eng.generate(p, SamplingParams(max_tokens=70, **GREEDY))
    b = eng.generate(p + a.token_ids + prompt(5, 98), SamplingParams(max_tokens=4, **GREEDY))
    assert b.usage.cached_tokens >= 256  # decode passed the 256 boundary: its rolling snapshot serves
    assert_idle(eng)


def test_cancel_mid_stream_frees_everything(eng):
    h = eng.submit(prompt(90, 3), SamplingParams(max_tokens=500, **GREEDY))
    events = iter(h)
    next(events)
    h.cancel()
    rest = list(events)
    assert rest[-1].kind == "finish" and rest[-1].finish_reason == "cancelled"
    assert_idle(eng)


def test_random_requests_and_cancels_leave_nothing_held(ckpt):
    e = make(ckpt, profile="C4", max_context=512, max_queue=256)
    rng = random.Random(0)
    try:
        handles = []
        for i in range(200):
            p = [rng.randrange(600) for _ in range(rng.randint(1, 150))]
            sp = SamplingParams(max_tokens=rng.randint(1, 12), temperature=rng.choice([0.0, 0.8]), seed=i)
            handles.append(e.submit(p, sp))
        for h in rng.sample(handles, 60):
            h.cancel()
        reasons = [[ev for ev in h][-1].finish_reason for h in handles]
        assert set(reasons) <= {"stop", "length", "cancelled"} and len(reasons) == 200
        assert_idle(e)
    finally:
        e.close()


def test_queue_overflow_is_refused_and_nothing_is_dropped(ckpt):
    e = make(ckpt, profile="C1", max_context=256, max_queue=3)
    try:
        handles = [e.submit(prompt(20, i), SamplingParams(max_tokens=30, **GREEDY)) for i in range(4)]
        with pytest.raises(QueueFullError, match="busy"):
            for i in range(10):
                handles.append(e.submit(prompt(20, 50 + i), SamplingParams(max_tokens=30, **GREEDY)))
        finals = [[ev for ev in h][-1] for h in handles]
        assert all(f.finish_reason == "length" and f.usage.completion_tokens == 30 for f in finals)
    finally:
        e.close()


def test_context_limits(ckpt):
    e = make(ckpt, profile="C1", max_context=128)
    try:
        with pytest.raises(ContextLengthError, match="128"):
            e.submit(prompt(128, 1), SamplingParams(max_tokens=1))
        out = e.generate(prompt(120, 1), SamplingParams(max_tokens=50, **GREEDY))
        assert out.finish_reason == "length" and len(out.token_ids) == 8
    finally:
        e.close()


def test_pages_scarce_requests_wait_and_all_finish(ckpt):
    """Four long requests on C2: the second pair waits for pages/slots, nothing is dropped."""
    e = make(ckpt, profile="C2", max_context=256, snapshots=0)
    try:
        hs = [e.submit(prompt(200, i), SamplingParams(max_tokens=56, **GREEDY)) for i in range(4)]
        finals = [[ev for ev in h][-1] for h in hs]
        assert [f.usage.completion_tokens for f in finals] == [56] * 4
        assert_idle(e)
    finally:
        e.close()


def test_seeded_sampling_reproduces_whatever_the_batch(eng):
    sp = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    alone = eng.generate(prompt(30, 7), sp).token_ids
    others = [eng.submit(prompt(40, 8 + i), SamplingParams(max_tokens=20, temperature=1.0)) for i in range(3)]
    again = eng.generate(prompt(30, 7), sp).token_ids
    for h in others:
        list(h)
    assert alone == again
    assert eng.generate(prompt(30, 7), SamplingParams(max_tokens=20, temperature=0.9, seed=4321)).token_ids != alone


def test_penalties_reach_the_sampler(eng):
    """A presence penalty larger than any logit gap makes greedy decoding pick no token twice (engine/core/sampling.py
    penalties_of); the same request without it repeats tokens on this tiny model."""
    plain = eng.generate(prompt(20, 3), SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)).token_ids
    assert len(set(plain)) < len(plain)
    penalised = eng.generate(prompt(20, 3), SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True,
                                                           presence_penalty=1e4)).token_ids
    assert len(set(penalised)) == len(penalised) == 40


def test_stop_strings_cut_exactly(eng):
    full = eng.generate(prompt(25, 11), SamplingParams(max_tokens=40, **GREEDY, skip_special_tokens=False))
    text = full.text
    assert len(text) > 12
    stop = text[8:12]
    cut = eng.generate(prompt(25, 11), SamplingParams(max_tokens=40, stop=[stop], **GREEDY, skip_special_tokens=False))
    assert cut.finish_reason == "stop"
    assert cut.text == text[:text.index(stop)]


def test_stream_events_and_stats(eng):
    h = eng.submit(prompt(50, 21), SamplingParams(max_tokens=6, **GREEDY))
    events = list(h)
    assert [e.kind for e in events] == ["delta"] * 6 + ["finish"]
    fin = events[-1]
    assert fin.usage.prompt_tokens == 50 and fin.usage.completion_tokens == 6
    assert fin.timings.ttft_ms > 0 and fin.timings.total_ms >= fin.timings.ttft_ms
    stats = eng.stats()
    for key in ("running", "waiting", "kv_pages_total", "kv_pages_used", "kv_pages_cached", "prefix_hit_tokens",
                "state_slots_used", "snapshots_cached"):
        assert key in stats


def test_submit_from_many_threads(eng):
    results = {}

    def worker(i):
        results[i] = eng.generate(prompt(10 + i, 200 + i), SamplingParams(max_tokens=5, **GREEDY)).token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 8 and all(len(v) == 5 for v in results.values())


def test_bad_parameters_are_refused(eng):
    with pytest.raises(ValueError, match="top_p"):
        eng.submit(prompt(5, 1), SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.submit([10 ** 9], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        eng.submit([], SamplingParams())


def ban(*token_ids):
    def proc(output, logits):
        logits[list(token_ids)] = float("-inf")
        return logits
    return proc


def test_reasoning_is_split_and_the_thinking_budget_closes_it(eng):
    tok = eng.tokenizer
    chat = [{"role": "user", "content": "Think about it."}]
    no_end = ban(tok.think_end_id, *tok.eos_token_ids)
    free = eng.generate(chat, SamplingParams(max_tokens=30, temperature=0.0, logits_processors=[no_end]))
    assert free.usage.reasoning_tokens == 30 and free.text == "" and free.reasoning
    capped = eng.generate(chat, SamplingParams(max_tokens=30, temperature=0.0, thinking_budget=6,
                                               logits_processors=[no_end]))
    assert 6 <= capped.usage.reasoning_tokens <= 8
    assert tok.think_end_id in capped.token_ids and capped.text  # content after the forced </think>
    assert "</think>" not in capped.text and "</think>" not in capped.reasoning
    off = eng.generate(chat, SamplingParams(max_tokens=10, temperature=0.0, logits_processors=[no_end]),
                       enable_thinking=False)
    assert off.usage.reasoning_tokens == 0 and off.reasoning == ""


def test_logits_processor_scripts_the_output(eng):
    script = eng.tokenizer.encode("hello world")

    def force(output, logits):
        forced = torch.full_like(logits, float("-inf"))
        forced[script[len(output)] if len(output) < len(script) else eng.tokenizer.eos_token_ids[0]] = 0
        return forced

    out = eng.generate(prompt(10, 5), SamplingParams(max_tokens=20, temperature=0.7, logits_processors=[force]))
    assert out.text == "hello world" and out.finish_reason == "stop"


def test_int8_kv_stays_close_to_full_precision(ckpt, eng):
    """Int8 KV (per-token, per-head scales): logits within 2% (max-abs relative) of full precision."""
    q = make(ckpt, profile="C1", max_context=1024, kv_dtype="int8")
    try:
        ids = prompt(300, 31)
        out = q.generate(ids, SamplingParams(max_tokens=12, **GREEDY))
        full = eng.score(ids + out.token_ids)
        quant = q.score(ids + out.token_ids)
    finally:
        q.close()
    err = ((quant - full).abs().max() / full.abs().max()).item()
    assert err < 0.02, err


def test_a_failing_logits_processor_ends_only_its_request(eng):
    def broken(output, logits):
        raise RuntimeError("boom")

    bad = eng.submit(prompt(10, 1), SamplingParams(max_tokens=5, logits_processors=[broken]))
    good = eng.submit(prompt(10, 2), SamplingParams(max_tokens=5, **GREEDY))
    bad_final, good_final = [ev for ev in bad][-1], [ev for ev in good][-1]
    assert bad_final.finish_reason == "error" and "boom" in bad_final.error
    assert good_final.finish_reason == "length" and good_final.usage.completion_tokens == 5
    assert_idle(eng)


def test_nothing_left_to_sample_is_an_error_not_token_zero(eng):
    def ban_all(output, logits):
        return torch.full_like(logits, float("-inf"))

    final = [ev for ev in eng.submit(prompt(10, 3), SamplingParams(max_tokens=5, logits_processors=[ban_all]))][-1]
    assert final.finish_reason == "error" and "excluded" in final.error
    with pytest.raises(ValueError, match="seed"):
        eng.submit(prompt(5, 1), SamplingParams(seed=1 << 70))


def test_warm_up_runs_the_prefill_variants_a_first_chat_prompt_needs(ckpt, monkeypatch):
    """On CUDA the engine warms up at load so that a first request compiles no Triton kernel; a short prompt
    whose prefill step saves the GDN state in passing (what most chat prompts do) uses a kernel variant of its
    own, so the warm-up must run one (called here on the CPU, where the ops are the references)."""
    from qwendesk_kernels import gdn, ops
    steps = []
    real = ops.gated_delta_rule

    def spy(q, *args):
        steps.append((q.shape[0], len(args) > 8 and args[8] is not None))     # (tokens, snapshot in the step)
        return real(q, *args)
    e = make(ckpt, max_context=1024)
    try:
        monkeypatch.setattr(ops, "gated_delta_rule", spy)
        e._warm_up()
        assert_idle(e)
    finally:
        e.close()
    assert any(snap and tokens <= gdn.RECURRENT_MAX_TOKENS for tokens, snap in steps), steps
    assert any(not snap and tokens % 2 for tokens, snap in steps), steps     # the odd length


def test_short_prefill_steps_take_the_prefill_kernels():
    """Decode kernels run one row per sequence (or a verify length the caller names); a prompt's short last step of
    2..8 rows would otherwise compile a decode-kernel variant per row count on its first use."""
    from engine.model.batch import build_batch
    assert build_batch([3, 3], [128, 0], [0, 1], [[0, 1, 2], [3]], 64, "cpu").decode_len == 0
    assert build_batch([1, 1], [5, 9], [0, 1], [[0], [1]], 64, "cpu").decode_len == 1
    assert build_batch([3], [5], [0], [[0]], 64, "cpu", decode_len=3).decode_len == 3


def test_decode_with_a_step_in_flight_gives_the_tokens_of_step_by_step(ckpt, eng):
    """Requests the host need not see before sampling decode with a step in flight (tokens sampled on the device
    and read while the next step runs); with a logits processor (here one that changes nothing) each step waits for
    the host. Both give the same tokens: greedy and seeded, batched, ended by length or by a stop token at different
    steps, past page boundaries (a second turn then reuses the decoded pages and snapshot) and after a cancel."""
    def same(output, logits):
        return logits

    long = prompt(40, 50)
    stop = eng.generate(long, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)).token_ids[12]
    kinds = [dict(temperature=0.0, ignore_eos=True, max_tokens=90),
             dict(temperature=0.9, top_p=0.9, seed=7, ignore_eos=True, max_tokens=75),
             dict(temperature=0.0, ignore_eos=True, max_tokens=60, stop_token_ids=[stop]),
             dict(temperature=0.7, seed=3, ignore_eos=True, max_tokens=5)]
    prompts = [long, prompt(70, 51), long, prompt(9, 52)]
    results = {}
    for mode in ("in flight", "step by step"):
        extra = {} if mode == "in flight" else {"logits_processors": [same]}
        cancelled = eng.submit(prompt(30, 53), SamplingParams(max_tokens=400, temperature=0.0, **extra))
        handles = [eng.submit(p, SamplingParams(**k, **extra)) for p, k in zip(prompts, kinds)]
        events = iter(cancelled)
        next(events)
        cancelled.cancel()
        assert [ev for ev in events][-1].finish_reason == "cancelled"
        outs = [[t for ev in h for t in ev.token_ids] for h in handles]
        turn2 = eng.generate(prompts[0] + outs[0] + prompt(5, 54), SamplingParams(max_tokens=6, temperature=0.0,
                                                                                   **extra))
        results[mode] = outs, turn2.token_ids
        assert turn2.usage.cached_tokens >= 128          # the decoded pages and the rolling snapshot serve
        assert_idle(eng)
        assert all(h._events.empty() for h in handles + [cancelled])    # nothing after a request's finish
    assert results["in flight"] == results["step by step"]
    outs = results["in flight"][0]
    assert [len(o) for o in outs] == [90, 75, 13, 5] and outs[2][-1] == stop


def test_a_failing_release_after_a_failed_step_still_ends_every_request(ckpt, monkeypatch):
    """A step fails, and then giving back the first request's cache fails too: every request still gets its finish
    event (an error), and the engine serves the next one."""
    e = make(ckpt, profile="C2", max_context=256)
    try:
        runner_forward, release = e._runner.forward, e._scheduler._release
        state = {"forward": 0, "release": 0}

        def failing_forward(*args, **kw):
            state["forward"] += 1
            if state["forward"] == 3:
                raise RuntimeError("step failed")
            return runner_forward(*args, **kw)

        def failing_release(seq):
            state["release"] += 1
            if state["release"] == 1:
                raise RuntimeError("release failed")
            return release(seq)

        monkeypatch.setattr(e._runner, "forward", failing_forward)
        monkeypatch.setattr(e._scheduler, "_release", failing_release)
        handles = [e.submit(prompt(8, i), SamplingParams(max_tokens=20, **GREEDY)) for i in range(2)]
        finals = []
        reader = threading.Thread(target=lambda: finals.extend([ev for ev in h][-1] for h in handles), daemon=True)
        reader.start()
        reader.join(timeout=60)
        assert not reader.is_alive(), "a request never got its finish event"
        assert [f.finish_reason for f in finals] == ["error", "error"]
        assert all("step failed" in f.error for f in finals) and state["release"] >= 2
        after = e.generate(prompt(8, 5), SamplingParams(max_tokens=3, **GREEDY))
        assert after.finish_reason == "length" and len(after.token_ids) == 3
    finally:
        e.close()


def test_a_cancelled_load_stops_between_weights_and_raises(ckpt):
    from engine.api import LoadCancelled

    cancel, reports = threading.Event(), []

    def progress(stage, done, total):
        reports.append((stage, done, total))
        if len(reports) == 3:
            cancel.set()                  # the user pressed Cancel while the third weight was read

    with pytest.raises(LoadCancelled):
        Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32"), progress=progress, cancel=cancel)
    assert len(reports) == 3 and reports[-1][1] < reports[-1][2]
    make(ckpt).close()                    # and the next load goes through


def test_load_progress_counts_the_weights_by_their_size(ckpt):
    """Counted one per weight, the time left grew as the load went (a norm of a few KiB, then an MLP of MiBs):
    issue 47's int4 conversion went from 27 s left to 3 min 50 s."""
    reports = []
    make_engine = Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32"),
                         progress=lambda stage, done, total: reports.append((stage, done, total)))
    make_engine.close()
    dones = [done for stage, done, _ in reports if stage == "Loading weights"]
    total = next(total for stage, _, total in reports if stage == "Loading weights")
    steps = [b - a for a, b in zip([0, *dones], dones)]
    assert dones == sorted(dones) and dones[-1] == total and len(set(steps)) > 2
