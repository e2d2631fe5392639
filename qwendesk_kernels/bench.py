"""Kernel benchmark harness (GPU): `python -m qwendesk_kernels.bench [family ...]`.

Measures the ceilings of the card in the same run (device-to-device copy, bf16 matmul), then
every benchmark case of the kernel families (qwendesk_kernels/bench_*.py, each exposing `cases()`), and
prints one table: median time, achieved bandwidth / FLOP rate, fraction of the ceiling, and the
speed-up over the torch reference or torch's own op where the case has one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from collections.abc import Callable

import torch

FAMILIES = ("misc", "attention", "gdn", "sampling", "quant")


@dataclass
class Case:
    family: str
    name: str
    fn: Callable[[], object]           # the kernel call, inputs bound
    bytes: float = 0.0                 # fewest bytes it must move
    flops: float = 0.0
    baseline: Callable[[], object] | None = None   # torch reference / torch op on the same inputs
    target: str = ""                   # the target, in words (e.g. ">= 70% of copy bw")
    target_frac: float | None = None   # fraction of the relevant ceiling to meet
    target_us: float | None = None     # or an absolute time budget


@dataclass
class Result:
    family: str
    name: str
    us: float
    tbps: float
    tflops: float
    frac: float
    speedup: float | None
    target: str
    met: bool | None


def graph_replay(fn):
    """Capture fn (run once first, on a side stream, to compile it) into a CUDA graph; returns its replay.
    The replay holds on to fn: the graph reads the tensors fn closes over, which must outlive it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay(_inputs=fn):
        graph.replay()
    return replay


def time_us(fn, warmup_ms=25, rep_ms=200) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def ceilings() -> dict:
    n = 1 << 30
    src = torch.randn(n // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    copy_us = time_us(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_us = time_us(lambda: a @ b)
    return {"copy_tbps": 2 * n / copy_us / 1e6, "matmul_tflops": 2 * 8192 ** 3 / mm_us / 1e6}


def run_case(c: Case, ceil: dict) -> Result:
    us = time_us(c.fn)
    tbps = c.bytes / us / 1e6 if c.bytes else 0.0
    tflops = c.flops / us / 1e6 if c.flops else 0.0
    frac = max(tbps / ceil["copy_tbps"], tflops / ceil["matmul_tflops"])
    speedup = time_us(c.baseline) / us if c.baseline else None
    met = None
    if c.target_frac is not None:
        met = frac >= c.target_frac
    elif c.target_us is not None:
        met = us <= c.target_us
    return Result(c.family, c.name, us, tbps, tflops, frac, speedup, c.target, met)


def run_family(fam: str, ceil: dict) -> list[Result]:
    mod = importlib.import_module(f"qwendesk_kernels.bench_{fam}")
    results = []
    for case in mod.cases():
        try:
            results.append(run_case(case, ceil))
        except Exception as e:  # one broken case must not hide the others
            print(f"{case.family}/{case.name}: FAILED {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        torch.cuda.empty_cache()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qwendesk_kernels.bench")
    ap.add_argument("families", nargs="*", default=list(FAMILIES), help=f"some of: {' '.join(FAMILIES)} (default: all)")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--ceilings", help=argparse.SUPPRESS)   # set by the parent: one family per process
    args = ap.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        ap.error(f"no kernel family {unknown[0]!r} (the families: {', '.join(FAMILIES)})")
    if not torch.cuda.is_available():
        ap.exit(2, f"{ap.prog}: error: needs a CUDA GPU; none is available\n")
    ceil = json.loads(args.ceilings) if args.ceilings else ceilings()
    if args.ceilings:  # child: one family, results as JSON on stdout's last line
        results = run_family(args.families[0], ceil)
        print("RESULTS " + json.dumps([asdict(r) for r in results]))
        return 0
    print(f"ceilings: copy {ceil['copy_tbps']:.2f} TB/s, bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s", flush=True)
    results = []
    for fam in args.families:
        # a separate process per family: a kernel fault (illegal address) poisons its CUDA context
        proc = subprocess.run([sys.executable, "-m", "qwendesk_kernels.bench", fam, "--ceilings", json.dumps(ceil)],
                              capture_output=True, text=True)
        sys.stderr.write(proc.stderr[-4000:])
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
        if lines:
            results += [Result(**r) for r in json.loads(lines[-1][len("RESULTS "):])]
        else:
            print(f"{fam}: no results (exit {proc.returncode})", file=sys.stderr)
    print(f"\n{'case':58s} {'us':>9s} {'TB/s':>6s} {'TFLOP/s':>8s} {'ceil%':>6s} {'vs ref':>7s}  target")
    for r in results:
        sp = f"{r.speedup:6.2f}x" if r.speedup else "      -"
        met = "" if r.met is None else (" MET" if r.met else " MISSED")
        print(f"{r.family + '/' + r.name:58s} {r.us:9.1f} {r.tbps:6.2f} {r.tflops:8.1f} {100 * r.frac:5.1f}% {sp}  "
              f"{r.target}{met}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": ceil, "results": [asdict(r) for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
