"""The soak driver (tests/soak.py) against a real qwendesk-serve process: a CI-sized run (150 requests, ~20 s), the
GPU soak's random-weights server at the tiny shape (a few requests), and the full 2,000-request run behind the `soak`
marker (`make soak`)."""

import json

import pytest

from tests.soak import Options, soak, table


def run_soak(tmp_path, **kw) -> dict:
    report = soak(Options(workdir=str(tmp_path), **kw))
    assert report["passed"], table(report) + "\n" + json.dumps(report["bad_examples"], indent=1)
    return report


def test_a_short_soak_leaves_no_5xx_no_hung_request_and_the_engine_at_its_baseline(checkpoint, tmp_path):
    # (RSS is taken as settled half-way: 30 requests, the default 20%, are too few for the allocators' pools, and
    # the RSS check then failed now and then by some 20 MB)
    report = run_soak(tmp_path, model=str(checkpoint("base")), requests=150, clients=8, max_tokens=24, warmup=0.5)
    mix = report["mix"]
    assert all(mix.get(k, 0) > 0 for k in ("chat", "completions", "responses", "messages", "streamed", "drop_before",
                                           "drop_mid", "cancel", "tools_auto", "tools_required", "json_schema", "long"))
    assert report["counters"]["prefix_cache_hit_tokens_total"] > 0         # prefixes came back from the cache
    assert report["counters"]["host_cache_hit_snapshots_total"] > 0        # old turns' state came back from RAM
    after = report["after"]
    assert after["host_cache_bytes"] > 0 and after["disk_cache_pages"] > 0  # both tiers were written


def test_the_gpu_soaks_server_runs_at_the_tiny_shape(tmp_path):
    """What `--shape 27b` runs on a GPU (docs/reliability.md), on the CPU: tests/random_serve.py, qwendesk-serve
    around random weights built in place, with the real vocabulary and chat template; a few requests (sampling from
    248K logits on the CPU is slow)."""
    report = run_soak(tmp_path, shape="tiny", weights="bf16", requests=16, clients=4, max_tokens=8)
    assert report["options"]["shape"] == "tiny" and report["requests_sent"] == 16
    assert report["gpu"]["before_mb"] == report["gpu"]["after_mb"] == 0     # a CPU engine reports no GPU memory


@pytest.mark.soak
def test_the_full_soak(checkpoint, tmp_path):
    run_soak(tmp_path, model=str(checkpoint("base")), requests=2000, clients=12)


@pytest.mark.parametrize("argv, says", [(["--conversations", "0"], "--conversations: at least 1"),
                                        (["--requests", "-3"], "--requests: at least 1"),
                                        (["--shape", "70b"], "--shape: one of"),
                                        (["--weights", "fp8"], "--weights: int4 or bf16")])
def test_wrong_flags_are_one_error_line(argv, says, capsys):
    from tests.soak import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and says in err[-1] and not any("Traceback" in line for line in err)
