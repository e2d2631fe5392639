"""The grouped MoE experts (qwendesk_kernels/moe_grouped.py) at the 35B-A3B shape: `python -m
qwendesk_kernels.bench_moe_grouped`.

One layer's routed experts (hidden 2048, expert width 512, 256 routed experts + the shared one as expert 256, 8 + 1
pairs per token, the router's distinct top-8 drawn at random) for T tokens, int4 (G = 128) and bf16, each case
checked against the torch reference first. Columns: ms per call, eager (five launches from Python) and replayed
from a CUDA graph (the GPU's time: what a captured verify step or the launch-free prefill would see); TFLOP/s of
the real work (6 T P H I flops: no padding rows, no skipped blocks); the weight bytes of the experts the routing
touched (each read at least once) and that over the graph time. Baselines at the largest T: the per-expert loop of
the torch path before it (qwendesk_kernels.quant / torch matmuls per expert with pairs: host syncs, one GEMM each) and
the torch reference (moe_grouped_ref).
--sweep: every config of sweep_configs per case as well (graph time), to choose default_config's table.
"""

from __future__ import annotations

import argparse
import sys

import torch

from qwendesk_kernels.activation import silu_mul
from qwendesk_kernels.bench import graph_replay, time_us
from qwendesk_kernels.moe_grouped import BLOCK_MS, default_config, moe_grouped_ref, moe_grouped_triton
from qwendesk_kernels.quant import int4_linear
from qwendesk_kernels.quant_format import Int4Weight, pack_int4, weight_rows

E, H, I, P = 257, 2048, 512, 9
G = 128
TOKENS = (16, 64, 512, 8192)


def sweep_configs(int4: bool) -> list[dict]:
    """The configs --sweep times (and the GPU tests check): each BM with two column tiles and two depths."""
    return [dict(BM=bm, BN_UP=bn_up, BN_DOWN=bn_down, BK=64, WARPS=8 if bm == 128 else 4, STAGES=stages)
            for bm in BLOCK_MS for bn_up, bn_down in ((32, 64), (64, 128)) for stages in ((2, 3) if int4 else (3, 4))]


def _routing(T: int, seed: int = 0):
    gen = torch.Generator("cuda").manual_seed(seed)
    routed = torch.rand(T, E - 1, generator=gen, device="cuda").topk(P - 1, dim=1).indices
    ids = torch.cat([routed, torch.full((T, 1), E - 1, device="cuda")], dim=1).to(torch.int32)
    weights = torch.rand(T, P, generator=gen, device="cuda")
    return ids, weights / weights[:, :-1].sum(1, keepdim=True)


def _experts(int4: bool):
    """Random stacked gate_up [2 I E, H] and down [H E, I]: bf16, or int4 codes with scales of the same spread."""
    weights = []
    for N, K in ((2 * I * E, H), (H * E, I)):
        if int4:
            q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device="cuda")
            scales = ((0.5 + torch.rand(N, K // G, device="cuda")) / (4 * K ** 0.5)).bfloat16()
            weights.append(pack_int4(q, scales, torch.full_like(scales, 7.5), G))
        else:
            weights.append(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5)
    return weights


def _expert_bytes(w) -> int:
    """Bytes of one expert's rows of a stacked weight."""
    if isinstance(w, Int4Weight):
        return sum(t.numel() * t.element_size() for t in (w.qweight, w.scales, w.zeros)) // E
    return w.numel() * w.element_size() // E


def _per_expert_loop(x, ids, weights, gate_up, down, inter):
    """The torch path the grouped kernels replace: pairs sorted by expert, one GEMM per expert with pairs."""
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    tokens = order // P
    counts = torch.bincount(flat, minlength=E).tolist()
    xs = x[tokens]
    out = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n:
            rows = slice(start, start + n)
            if isinstance(gate_up, Int4Weight):
                gu, dn = weight_rows(gate_up, 2 * inter * e, 2 * inter), weight_rows(down, H * e, H)
                out[rows] = int4_linear(silu_mul(int4_linear(xs[rows], gu)), dn)
            else:
                gu, dn = gate_up[2 * inter * e:2 * inter * (e + 1)], down[H * e:H * (e + 1)]
                out[rows] = silu_mul(xs[rows] @ gu.t()) @ dn.t()
            start += n
    out *= weights.flatten()[order, None].to(out.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qwendesk_kernels.bench_moe_grouped")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts, comma-separated")
    ap.add_argument("--sweep", action="store_true", help="also time every config of sweep_configs")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.exit(2, f"{ap.prog}: error: needs a CUDA GPU; none is available\n")
    tokens = [int(t) for t in args.tokens.split(",")]
    print(f"{'case':40s} {'eager ms':>9s} {'graph ms':>9s} {'TFLOP/s':>8s} {'weights MB':>11s} {'TB/s':>6s} "
          f"{'rel err':>8s}")

    def row(name, eager_us, graph_us, flops, touched=0, err=float("nan")):
        us = graph_us if graph_us == graph_us else eager_us          # the graph's time where there is one
        print(f"{name:40s} {eager_us / 1e3:9.3f} {graph_us / 1e3:9.3f} {flops / us / 1e6:8.1f} {touched / 1e6:11.1f} "
              f"{touched / us / 1e6:6.2f} {err:8.1e}", flush=True)

    nan = float("nan")
    for int4 in (True, False):
        kind = "int4" if int4 else "bf16"
        gate_up, down = _experts(int4)
        per_expert = _expert_bytes(gate_up) + _expert_bytes(down)
        for T in tokens:
            ids, weights = _routing(T)
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            out = moe_grouped_triton(x, ids, weights, gate_up, down, I)
            ref = moe_grouped_ref(x, ids, weights, gate_up, down, I)
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            eager = time_us(lambda: moe_grouped_triton(x, ids, weights, gate_up, down, I))
            graph = time_us(graph_replay(lambda: moe_grouped_triton(x, ids, weights, gate_up, down, I)))
            touched = torch.unique(ids).numel() * per_expert
            flops = 6 * T * P * H * I
            row(f"{kind} T={T} BM={default_config(T * P, E, int4)['BM']}", eager, graph, flops, touched, err)
            if args.sweep:
                for c in sweep_configs(int4):
                    us = time_us(graph_replay(lambda: moe_grouped_triton(x, ids, weights, gate_up, down, I, c)))
                    row(f"  BM{c['BM']} up{c['BN_UP']} down{c['BN_DOWN']} w{c['WARPS']} s{c['STAGES']}", nan, us,
                        flops, touched)
        T = max(tokens)
        ids, weights = _routing(T)
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        for name, fn in (("per-expert loop", _per_expert_loop), ("torch reference", moe_grouped_ref)):
            us = time_us(lambda: fn(x, ids, weights, gate_up, down, I), warmup_ms=1, rep_ms=1)
            row(f"{kind} T={T} {name}", us, nan, 6 * T * P * H * I)
    return 0


if __name__ == "__main__":
    sys.exit(main())
