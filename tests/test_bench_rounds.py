"""engine/bench/spec.py's round figures (no GPU needed): full collections seen in any thread, the medians of timed
rounds, the table that prints them, and the speculation bench run whole on a tiny model."""

import gc
import threading
import time
import types

import pytest
import torch

from engine.bench.round_timing import TimedRound, full_collections, loop_stacks, round_gpu_times, slow_stacks
from engine.bench.spec import report


def test_the_bench_sees_each_full_collection_and_no_young_one():
    gc.disable()                                  # only the collections asked for here
    try:
        with full_collections() as spans:
            gc.collect(0)
            gc.collect(1)
            gc.collect()
            gc.collect()
    finally:
        gc.enable()
    assert len(spans) == 2 and all(0 <= end - start < 60 for start, end in spans)
    assert spans[0][1] <= spans[1][0]


def test_round_figures_are_medians_of_what_was_measured():
    rounds = [TimedRound(0.0, 0.010, 0.5, False, 8.0, None), TimedRound(0.010, 0.020, 0.7, False, 9.0, 0.1),
              TimedRound(0.020, 0.030, 0.6, False, 30.0, 0.3)]
    t = round_gpu_times(rounds)
    assert abs(t["launch_ms"] - 0.6) < 1e-9 and t["gpu_ms"] == 9.0
    assert abs(t["idle_ms"] - 0.2) < 1e-9                      # the first round has no round before it
    off_gpu = [TimedRound(0.0, 0.01, 0.4, False)]
    assert round_gpu_times(off_gpu) == {"launch_ms": 0.4, "gpu_ms": 0.0, "idle_ms": 0.0}
    assert round_gpu_times([]) == {"launch_ms": 0.0, "gpu_ms": 0.0, "idle_ms": 0.0}


def test_the_table_prints_every_column(capsys):
    row = dict(profile="C8", k=3, p=0.82, adaptive=False, tok_s=874.1, vs_plain=0.9, tokens_per_round=3.04,
               expected_tokens_per_round=3.04, round_ms=20.68, first_round_ms=20.33,
               round_ms_quartiles=[8.85, 19.66, 19.85, 20.47, 327.49], launch_ms=0.61, gpu_ms=18.73, idle_ms=0.04,
               followed=87, slow_rounds=2,
               slow_rounds_in_gc=1, gc_full=1, gc_full_max_ms=311.5, exact=True, steps_by_drafts=[0, 0, 0, 90])
    report({"rows": [row], "plain_C8_tok_s": 970.9})
    header, line = capsys.readouterr().out.strip().splitlines()[:2]
    assert "idle" in header and "follow" in header and "slow (gc)" in header and "gc ms (n)" in header
    assert "327.49" in line and "0.61" in line and "18.73" in line and "0.04" in line and " 87 " in line
    assert "2 (1)" in line and "311.5 (1)" in line


def test_slow_rounds_say_where_the_loop_was():
    """The sampler reads the loop thread's stack: a round spent in one function names it."""
    def hold_the_loop(seconds):
        time.sleep(seconds)

    ready = threading.Event()

    def loop_body():
        ready.wait()
        hold_the_loop(0.15)
    thread = threading.Thread(target=loop_body)
    thread.start()
    eng = types.SimpleNamespace(_loop=types.SimpleNamespace(_thread=thread))
    with loop_stacks(eng) as samples:
        t0 = time.perf_counter()
        ready.set()
        thread.join()
        t1 = time.perf_counter()
    (line,) = slow_stacks([(t0, t1)], samples)
    assert "hold_the_loop" in line and line.split(" ms")[0].replace(".", "").isdigit()
    with loop_stacks(eng, on=False) as none:
        pass
    assert none == [] and slow_stacks([(t0, t1)], []) == []


def test_the_speculation_bench_runs_whole_on_the_cpu():
    """bench_speculation end to end on a tiny random model (C2, so no C1-only graph components): the plain baseline
    measured twice from one engine, every row exact against it, its round columns filled."""
    import argparse

    from engine.bench.random_model import build_random_model, text_config
    from engine.bench.spec import bench_speculation
    model = build_random_model(text_config("tiny"), "bf16", mtp=True, device="cpu", dtype=torch.float32)
    args = argparse.Namespace(profiles=["C2"], spec_context=40, decode_tokens=12, prefill_chunk=512, kv_dtype="bf16",
                              gc_freeze=False, drafts=[2], draft_oracle=[0.82], profile_rounds=False, slow_stacks=True)
    out = bench_speculation(model, args)
    runs = out["plain_C2_runs_tok_s"]
    assert len(runs) == 2 and out["plain_C2_tok_s"] == pytest.approx(max(runs), rel=1e-2)
    assert [(r["adaptive"], r["exact"]) for r in out["rows"]] == [(False, True), (True, True)]
    assert all(r["rounds"] > 0 and r["round_ms_quartiles"][2] > 0 for r in out["rows"])
