"""MoE decode at the 35B-A3B shape (GPU): `python -m qwendesk_kernels.bench_moe`.

A layer: the router (a bf16 GEMV over 256 + 1 rows: the shared expert's gate last), routing
(qwendesk_kernels/moe_route.py) and the experts (ops.moe_experts: int4 on the mma kernels,
qwendesk_kernels/moe_decode_mma.py; bf16 on qwendesk_kernels/moe_decode.py; the shared expert stacked as expert 256),
for T = 1, 2, 4, 8 tokens at int4 (G = 128), T = 1 and 8 at bf16; the router's GEMV and the routing alone. 40 layers,
each with weights and inputs of its own (as in the model: no layer's experts are still in L2), are replayed from one
CUDA graph; per layer = the graph's time / 40. Bytes per layer: what it must read (the router, the distinct experts
its tokens chose, x) and write (out). Launches per layer: the kernels the profiler sees in one eager layer. Baselines:
the sorted torch loop (qwendesk_kernels/moe_sorted.py, eager: it syncs with the host), and at int4 the tl.dot decode
kernels (qwendesk_kernels/moe_decode.py), over the same 40 layers. Then the configs of both int4 decode paths are
swept at T = 1 and 8, experts only, and at T = 2 and 4 the mma path's slots per pair against grouped by expert
(GROUP_MIN_T). `--kinds int4` leaves out bf16, `--no-sweep` the sweeps.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from qwendesk_kernels import ops
from qwendesk_kernels.bench import graph_replay, time_us
from qwendesk_kernels.moe_decode import DEFAULT_CONFIG, moe_decode
from qwendesk_kernels.moe_decode_mma import MOE_MMA_CONFIG, moe_decode_mma
from qwendesk_kernels.moe_sorted import moe_sorted
from qwendesk_kernels.quant_format import Int4Weight

E, K_TOP, H, I, LAYERS, G = 256, 8, 2048, 512, 40, 128
DEV = "cuda"
SWEEP = [dict(GATE_UP_BN=32, GATE_UP_WARPS=2), dict(GATE_UP_BN=32, GATE_UP_WARPS=4),
         dict(GATE_UP_BN=64, GATE_UP_WARPS=4), dict(DOWN_BN=32, DOWN_WARPS=2), dict(DOWN_BN=64, DOWN_WARPS=4),
         dict(PER_SM=4), dict(PER_SM=16), dict(GATE_UP_PER=H // 128), dict(DOWN_PER=K_TOP + 1)]
MMA_SWEEP: list[dict[str, int | None]] = [
    dict(GROUP_MIN_T=99), dict(GROUP_MIN_T=1), dict(DOWN_R=1), dict(DOWN_PER_SM=8), dict(DOWN_PER_SM=32),
    dict(GATE_UP_PER_SM=8), dict(GATE_UP_PER_SM=32), dict(GATE_UP_NW=2, DOWN_NW=2, GATE_UP_PER_SM=8, DOWN_PER_SM=8),
    dict(MAXNREG=None)]


def _int4(N: int, K: int) -> Int4Weight:
    """Random codes straight in the packed layout, scales ~0.007 and zeros ~7.5 (bf16)."""
    words = torch.randint(-2**31, 2**31 - 1, (N // 16, K // 128, 16, 16), dtype=torch.int32, device=DEV)
    params = (N // 16, K // G, 16)
    return Int4Weight(words, (0.002 + 0.01 * torch.rand(params, device=DEV)).bfloat16(),
                      (7 + torch.rand(params, device=DEV)).bfloat16(), G, (N, K))


def _layers(kind: str) -> list[dict]:
    """40 layers' router, stacked experts (+ the shared one) and inputs."""
    layers = []
    for _ in range(LAYERS):
        if kind == "int4":
            gate_up, down = _int4((E + 1) * 2 * I, H), _int4((E + 1) * H, I)
        else:
            gate_up = torch.randn((E + 1) * 2 * I, H, device=DEV).bfloat16() / H ** 0.5
            down = torch.randn((E + 1) * H, I, device=DEV).bfloat16() / I ** 0.5
        layers.append(dict(router=torch.randn(E + 1, H, device=DEV).bfloat16() / H ** 0.5, gate_up=gate_up,
                           down=down))
    return layers


def _nbytes(t) -> int:
    if isinstance(t, Int4Weight):
        return sum(_nbytes(x) for x in (t.qweight, t.scales, t.zeros))
    return t.numel() * t.element_size()


def _layer_bytes(layer: dict, ids: torch.Tensor, T: int) -> int:
    """Router + the distinct experts chosen (each 1 / (E + 1) of the stacked weights) + x read, out written."""
    experts = len(set(ids.flatten().tolist()))
    stacked = (_nbytes(layer["gate_up"]) + _nbytes(layer["down"])) // (E + 1)
    return _nbytes(layer["router"]) + experts * stacked + 2 * T * H * 2


def _launches(fn) -> str:
    """The kernels one eager call launches."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return str(sum(k.count for k in prof.key_averages()))


def _row(name: str, us: float, nbytes: float, launches: str = "") -> None:
    print(f"{name:64s} {us:9.2f} {nbytes / 1e6:9.2f} {nbytes / us / 1e3:8.0f} {launches:>9s}", flush=True)


def bench(kind: str, sweep: bool) -> None:
    layers = _layers(kind)
    for T in (1, 2, 4, 8) if kind == "int4" else (1, 8):
        xs = [torch.randn(T, H, device=DEV).bfloat16() for _ in layers]

        def route(i):
            return ops.moe_route(F.linear(xs[i], layers[i]["router"]), K_TOP, shared=True)

        routes = [route(i) for i in range(LAYERS)]       # what every run below routes (the same inputs)

        def experts(i, moe=ops.moe_experts, **config):
            w = layers[i]
            return moe(xs[i], *routes[i], w["gate_up"], w["down"], I, **config)

        def layer(i, moe=ops.moe_experts):
            w = layers[i]
            return moe(xs[i], *route(i), w["gate_up"], w["down"], I)

        def graph_us(fn) -> float:
            return time_us(graph_replay(lambda: [fn(i) for i in range(LAYERS)])) / LAYERS

        nbytes = sum(_layer_bytes(w, ids, T) for w, (ids, _) in zip(layers, routes)) / LAYERS
        _row(f"{kind} T={T} layer: router + route + experts [graph]", graph_us(layer), nbytes,
             _launches(lambda: layer(0)))
        router_bytes = _nbytes(layers[0]["router"]) + T * H * 2
        _row(f"{kind} T={T} router + route, cuBLAS GEMV + moe_route [graph]", graph_us(route), router_bytes,
             _launches(lambda: route(0)))
        _row(f"{kind} T={T} experts [graph]", graph_us(experts), nbytes, _launches(lambda: experts(0)))
        us = time_us(lambda: [experts(i, moe_sorted) for i in range(LAYERS)]) / LAYERS
        _row(f"{kind} T={T} experts, sorted torch loop [eager, baseline]", us, nbytes,
             _launches(lambda: experts(0, moe_sorted)))
        if kind != "int4":
            continue
        _row(f"{kind} T={T} experts, tl.dot kernels (moe_decode) [graph]", graph_us(lambda i: experts(i, moe_decode)),
             nbytes, _launches(lambda: experts(0, moe_decode)))
        if T in (2, 4):                                   # where grouping starts to pay
            for grouping in (dict(GROUP_MIN_T=99), dict(GROUP_MIN_T=1)):
                _row(f"{kind} T={T} mma experts {grouping} [graph]",
                     graph_us(lambda i, cfg=grouping: experts(i, moe_decode_mma, config=cfg)), nbytes)
            continue
        if not sweep:
            continue
        for cfg in SWEEP:
            config = {**DEFAULT_CONFIG, **cfg}
            _row(f"{kind} T={T} experts {cfg} [graph]",
                 graph_us(lambda i, config=config: experts(i, moe_decode, config=config)), nbytes)
        for mma in MMA_SWEEP:
            _row(f"{kind} T={T} mma experts {mma} [graph]",
                 graph_us(lambda i, cfg=mma: experts(i, moe_decode_mma, config=cfg)), nbytes)


def main() -> None:
    parser = argparse.ArgumentParser(description="MoE decode at the 35B-A3B shape (GPU)")
    parser.add_argument("--kinds", nargs="+", choices=("int4", "bf16"), default=["int4", "bf16"])
    parser.add_argument("--no-sweep", action="store_true", help="leave out the config sweeps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("python -m qwendesk_kernels.bench_moe: needs a CUDA GPU")
    print(f"35B-A3B MoE layer: H {H}, I {I}, {E} experts + 1 shared (stacked), top {K_TOP}; {LAYERS} layers per "
          f"graph; decode config {DEFAULT_CONFIG}; mma config {MOE_MMA_CONFIG}")
    print(f"{'case':64s} {'us/layer':>9s} {'MB/layer':>9s} {'GB/s':>8s} {'launches':>9s}")
    for kind in args.kinds:
        bench(kind, not args.no_sweep)
        torch.cuda.empty_cache()                          # (the bf16 layers take 65 GB)


if __name__ == "__main__":
    main()
