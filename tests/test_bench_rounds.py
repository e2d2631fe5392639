"""engine/bench/spec.py's round figures (no GPU needed): full collections seen in any thread, the host's share
around rounds, and the table that prints them."""

import gc

from engine.bench.spec import full_collections, host_times, report


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


def test_host_times_are_medians_of_launch_delays_and_gaps():
    rounds = [(0.0, 0.001, 0.010), (0.012, 0.013, 0.020), (0.021, None, 0.030), (0.130, 0.132, 0.140)]
    t = host_times(rounds)
    assert abs(t["host_ms"] - 1.0) < 1e-9                     # 1, 1, 2 ms: a round without a graph is left out
    assert abs(t["between_ms"] - 2.0) < 1e-9                  # 2, 1, 100 ms
    assert host_times([]) == {"host_ms": 0.0, "between_ms": 0.0}


def test_the_table_prints_every_column(capsys):
    row = dict(profile="C8", k=3, p=0.82, adaptive=False, tok_s=874.1, vs_plain=0.9, tokens_per_round=3.04,
               expected_tokens_per_round=3.04, round_ms=20.68, first_round_ms=20.33,
               round_ms_quartiles=[8.85, 19.66, 19.85, 20.47, 327.49], host_ms=0.61, between_ms=0.84, slow_rounds=2,
               slow_rounds_in_gc=1, gc_full=1, gc_full_max_ms=311.5, exact=True, steps_by_drafts=[0, 0, 0, 90])
    report({"rows": [row], "plain_C8_tok_s": 970.9})
    header, line = capsys.readouterr().out.strip().splitlines()[:2]
    assert "host" in header and "slow (gc)" in header and "gc ms (n)" in header
    assert "327.49" in line and "0.61" in line and "0.84" in line and "2 (1)" in line and "311.5 (1)" in line
