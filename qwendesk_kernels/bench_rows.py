"""int4 GEMV time by rows M at the 27B's projection shapes (`python3 -m qwendesk_kernels.bench_rows`): what a
speculative verify of M = c x (k + 1) rows costs against a decode step's M = c. Each case is replayed from a CUDA graph
(triton.testing.do_bench); A is the dot GEMV (with the config its autotuner picked), C the mma GEMV (M <= 32: column
tiles of 8 rows past 8, their weight words shared through L1; "C-1W" the same on a grid of one resident wave (a
column tile's warps each: PER_SM / tiles programs per SM, where C's grid is sized for one-warp programs); "C-XT"
and "C-XT1" past 8 rows: a pair of column tiles in each warp, the weights unpacked once for both, two / one 16-row
weight tiles per warp), above 32 rows the fused GEMM."""

from __future__ import annotations

import argparse

import torch
import triton

from qwendesk_kernels import gemv_dot
from qwendesk_kernels.bench_quant import PROJ, _int4
from qwendesk_kernels.gemv_mma import (GEMV_MMA_DEFAULT, GEMV_MMA_PROGRAMS_PER_SM, GEMV_MMA_XT, GEMV_MMA_XT1,
                                       MMA_ROWS, X_TILE)
from qwendesk_kernels.quant import int4_linear_triton

ROWS = (1, 4, 8, 12, 16, 24, 32, 64)


def graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return 1e3 * triton.testing.do_bench(graph.replay, warmup=10, rep=50)


def main(rows: tuple[int, ...] = ROWS) -> None:
    for name in ("mlp_gate_up", "mlp_down", "gdn_in_qkvz"):
        N, K = PROJ[name]
        w = _int4(N, K)
        for M in rows:
            x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
            cells = []
            tiles = triton.next_power_of_2(triton.cdiv(M, X_TILE))
            one_wave = {**GEMV_MMA_DEFAULT, "PER_SM": max(1, GEMV_MMA_PROGRAMS_PER_SM // tiles)}
            for variant, config in (("A", None), ("C", None), ("C-1W", one_wave),
                                    ("C-XT", GEMV_MMA_XT), ("C-XT1", GEMV_MMA_XT1)):
                if variant != "A" and M > MMA_ROWS or variant != "A" and variant != "C" and M <= 8:
                    continue
                us = graph_us(lambda v=variant[0], c=config: int4_linear_triton(x, w, c, variant=v))
                tuned = gemv_dot.gemv_tuned.best_config.kwargs if variant == "A" and M <= 32 else ""
                cells.append(f"{variant} {us:7.1f} us {tuned}")
            print(f"{name:12s} {N}x{K} M={M:3d}  " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts M")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("qwendesk_kernels.bench_rows: needs a CUDA GPU")
    main(tuple(int(m) for m in args.rows.split(",")))
