"""The first launch's kernel warm-up on a GPU: how long loading a model takes with an empty Triton cache (what a
fresh install pays once: Triton compiles the launcher stubs and every kernel variant, the autotuned GEMVs tune)
and then with the cache that run filled, each in a fresh process, as the app does it (Engine with progress).

    python -m installer.gpu_warmup [--weights bf16 int4] [--device cuda]

A tiny checkpoint (tests/fixtures) has the real architecture, so the same kernels and variants compile; the
autotuning of a real model's larger shapes takes longer. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def load_once(checkpoint: str, weights: str, device: str) -> dict:
    """In this process: load the model, timing each progress stage."""
    from engine.api import Engine, EngineConfig

    stages: dict[str, float] = {}
    started = time.monotonic()
    last = [started, ""]

    def progress(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if last[1]:
            stages[last[1]] = round(stages.get(last[1], 0.0) + now - last[0], 2)
        last[:] = [now, stage]

    engine = Engine(EngineConfig(model=checkpoint, device=device, weights=weights), progress=progress)
    progress("", 0, 0)
    seconds = round(time.monotonic() - started, 2)
    engine.close()
    return {"load_s": seconds, "stages_s": stages}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", nargs="+", default=["bf16", "int4"])
    parser.add_argument("--device", default="cuda", help="cpu only checks this script (nothing compiles there)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(load_once(*args.child)))
        return 0
    from tests.fixtures.checkpoints import write_checkpoint

    work = Path(tempfile.mkdtemp(prefix="qwendesk-warmup-"))
    checkpoint = str(write_checkpoint(work / "calm128", "calm128"))
    results = {}
    for weights in args.weights:
        env = dict(os.environ, TRITON_CACHE_DIR=str(work / f"triton-{weights}"),
                   QWENDESK_CACHE_DIR=str(work / f"converted-{weights}"))
        runs = []
        for _ in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-m", "installer.gpu_warmup", "--child", checkpoint, weights,
                                   args.device],
                                  env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        results[weights] = {"cold": runs[0], "warm": runs[1]}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
