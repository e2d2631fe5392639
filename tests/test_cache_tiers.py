"""The cache tiers in a real engine (tiny checkpoint, CPU): a conversation pushed out of the GPU pool comes back from
the host tier, and after a restart from the disk tier (Engine.warm first), and either way the next turn equals a
cold run (greedy tokens identical, logprobs within 1e-4), with bf16 and int8 KV. A damaged disk entry found after a
restart costs only reuse, never correctness."""

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("gqa3_ratio3"))


def make(ckpt, **kw):
    # max_context 1024 at C1: a pool of 21 pages of 64 tokens, so two 1,000-token requests push a conversation out
    return Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile="C1", max_context=1024, **kw))


def prompt(n, seed):
    return torch.randint(0, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def same(a, b):
    assert a.token_ids == b.token_ids
    assert max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "k8v4"])
def test_host_and_disk_hits_equal_a_cold_run(ckpt, tmp_path, kv_dtype):
    params = SamplingParams(max_tokens=10, **GREEDY)
    tiers = dict(kv_dtype=kv_dtype, host_cache_gb=0.01, disk_cache=True, disk_cache_dir=str(tmp_path))
    first = prompt(300, 1)
    eng = make(ckpt, **tiers)
    try:
        reply = eng.generate(first, params)
        turn2 = first + reply.token_ids + prompt(20, 9)
        for seed in (2, 3):                            # other work pushes the conversation out of the GPU pool
            eng.generate(prompt(1000, seed), SamplingParams(max_tokens=8, **GREEDY))
        s = eng.stats()
        assert s["host_pages"] > 0 and s["host_snapshots"] > 0 and s["host_hit_pages"] == 0
        from_host = eng.generate(turn2, params)
        s = eng.stats()
        assert from_host.usage.cached_tokens == 256 and s["host_hit_pages"] == 4 and s["host_hit_snapshots"] == 1
    finally:
        eng.close()                                    # finishes the queued disk writes
    cold_engine = make(ckpt, kv_dtype=kv_dtype, host_cache_gb=0)
    try:
        cold = cold_engine.generate(turn2, params)
        turn3 = turn2 + cold.token_ids + prompt(7, 10)
        cold3 = cold_engine.generate(turn3, params)
    finally:
        cold_engine.close()
    assert cold.usage.cached_tokens == 0 and "host_pages" not in cold_engine.stats()
    same(from_host, cold)

    restarted = make(ckpt, **tiers)
    try:
        assert restarted.warm(turn2).result(timeout=60) == 320   # turn 2's end-of-turn snapshot, at 320 tokens
        assert restarted.stats()["disk_hit_pages"] == 5 and restarted.stats()["disk_hit_snapshots"] == 1
        from_disk = restarted.generate(turn2, params)
        assert from_disk.usage.cached_tokens == 320
        same(from_disk, cold)
    finally:
        restarted.close()

    # damage every page file: the next start reads none of them, and the turn is still right
    for path in (tmp_path).rglob("page/*.kv"):
        path.write_bytes(path.read_bytes()[:-1])
    again = make(ckpt, **tiers)
    try:
        out = again.generate(turn3, params)
        assert out.usage.cached_tokens == 0 and again.stats()["disk_rejected"] >= 1
        same(out, cold3)
    finally:
        again.close()


def test_tier_settings_are_checked():
    for bad in (dict(host_cache_gb=-1), dict(disk_cache_gb=0), dict(disk_cache=True, host_cache_gb=0)):
        with pytest.raises(ValueError):
            EngineConfig(model="m", **bad).validate()


def test_the_plan_shows_the_host_tier_apart_from_device_memory(ckpt):
    from engine.api import plan_for
    from engine.core.device import host_ram_bytes

    base = dict(model=ckpt, device="cpu", max_context=1024)
    off, some, default = (plan_for(EngineConfig(**base, host_cache_gb=gb)) for gb in (0, 1.5, None))
    assert (off.host_cache_bytes, some.host_cache_bytes) == (0, int(1.5 * (1 << 30)))
    assert default.host_cache_bytes == min(8 << 30, host_ram_bytes() // 4)
    assert off.total_bytes == some.total_bytes == default.total_bytes
    assert "host-RAM cache tier of 1.50 GiB (pinned at load on a GPU)" in some.summary()
    assert "host-RAM" not in off.summary()


def test_the_plan_shows_the_disk_tiers_write_staging(ckpt):
    """What the disk tier's writer stages in host memory (pinned on a GPU: one buffer of exactly this) is the plan's,
    and the engine's disk tier is built with it."""
    from engine.api import plan_for
    from engine.cache.disk import MAX_PENDING_BYTES

    base = dict(model=ckpt, device="cpu", max_context=1024)
    off, on = (plan_for(EngineConfig(**base, disk_cache=d)) for d in (False, True))
    assert (off.disk_staging_bytes, on.disk_staging_bytes) == (0, MAX_PENDING_BYTES)
    assert off.total_bytes == on.total_bytes
    assert "write staging 2.00 GiB" in on.summary() and "staging" not in off.summary()


def test_stats_show_the_disk_writes_finished_while_the_engine_idles(ckpt, tmp_path):
    """The loop refreshes its figures at each step; the disk tier's writer finishes after the last one."""
    with make(ckpt, disk_cache=True, disk_cache_dir=str(tmp_path)) as engine:
        engine.generate(prompt(300, 1), SamplingParams(max_tokens=4, **GREEDY))
        engine._disk.flush()
        on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*.kv"))
        stats = engine.stats()
        assert stats["disk_pages"] > 0 and stats["disk_bytes"] == on_disk
        assert engine._disk._staging.capacity == engine.plan().disk_staging_bytes > 0


def tiered(ckpt, folder, **kw):
    return Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile="C2", max_context=1024,
                               host_cache_gb=0.01, disk_cache=True, disk_cache_dir=str(folder), **kw))


def held_back(eng):
    """Hold the engine's disk reads until the returned event is set."""
    import threading
    go, read_many = threading.Event(), eng._disk.read_many
    eng._disk.read_many = lambda entries: (go.wait(30), read_many(entries))[1]
    return go


def test_a_request_reading_the_disk_tier_does_not_hold_up_the_running_streams(ckpt, tmp_path):
    """After a restart, a next turn whose prefix is on disk waits for its read (held back here) while another stream
    decodes to its end and a request sent after it is answered; warm() of it waits too, without blocking anything.
    Then it is answered from the cache, equal to a cold run, and a cancel meanwhile is clean."""
    import time

    params = SamplingParams(max_tokens=10, **GREEDY)
    first = prompt(300, 1)
    with tiered(ckpt, tmp_path) as eng:
        turn2 = first + eng.generate(first, params).token_ids + prompt(20, 9)
    with tiered(ckpt, tmp_path, disk_cache_gb=1) as eng:
        go = held_back(eng)
        started = time.monotonic()
        other = eng.submit(prompt(40, 7), SamplingParams(max_tokens=24, **GREEDY))
        cancelled = eng.submit(turn2, params)
        waiting = eng.submit(turn2, params)
        warmed = eng.warm(turn2)
        later = eng.submit(prompt(30, 8), SamplingParams(max_tokens=6, **GREEDY))
        assert [ev for ev in other][-1].usage.completion_tokens == 24
        assert [ev for ev in later][-1].usage.completion_tokens == 6 and time.monotonic() - started < 20
        assert not waiting.ready() and not warmed.done() and eng.stats()["disk_hit_pages"] == 0
        cancelled.cancel()
        go.set()
        assert warmed.result(timeout=30) == 256
        assert [ev for ev in cancelled][-1].finish_reason == "cancelled"
        events = list(waiting)
        assert events[-1].usage.cached_tokens == 256 and eng.stats()["disk_hit_pages"] == 4
    with Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile="C1", max_context=1024,
                             host_cache_gb=0)) as cold_engine:
        cold = cold_engine.generate(turn2, params)
    assert [t for ev in events for t in ev.token_ids] == cold.token_ids


def test_closing_while_a_disk_read_is_in_flight_waits_for_it_and_fails_the_pending_warm(ckpt, tmp_path):
    import threading

    first = prompt(300, 1)
    with tiered(ckpt, tmp_path) as eng:
        turn2 = first + eng.generate(first, SamplingParams(max_tokens=10, **GREEDY)).token_ids
    eng = tiered(ckpt, tmp_path)
    go = held_back(eng)
    warmed = eng.warm(turn2)
    request = eng.submit(turn2, SamplingParams(max_tokens=4, **GREEDY))
    threading.Timer(0.3, go.set).start()
    eng.close()                                        # returns once the read is done (it fills host memory)
    with pytest.raises(RuntimeError, match="stopped"):
        warmed.result(timeout=5)
    assert [ev for ev in request][-1].finish_reason == "cancelled"


def test_what_a_cancelled_request_had_read_is_kept_in_the_host_tier(ckpt, tmp_path):
    import time

    first = prompt(300, 1)
    with tiered(ckpt, tmp_path) as eng:
        turn2 = first + eng.generate(first, SamplingParams(max_tokens=10, **GREEDY)).token_ids
    with tiered(ckpt, tmp_path) as eng:
        go = held_back(eng)
        request = eng.submit(turn2, SamplingParams(max_tokens=4, **GREEDY))
        deadline = time.monotonic() + 20
        while not eng._cache.loading and time.monotonic() < deadline:   # its lookup started the reads
            time.sleep(0.01)
        request.cancel()
        assert [ev for ev in request][-1].finish_reason == "cancelled"
        go.set()
        while eng.stats().get("host_pages", 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        s = eng.stats()
        assert (s["host_pages"], s["host_snapshots"], s["disk_hit_pages"]) == (4, 1, 4)
