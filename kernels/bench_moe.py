"""MoE decode at the 35B-A3B shape (GPU): `python -m kernels.bench_moe`.

A layer: the router (a bf16 GEMV over 256 + 1 rows: the shared expert's gate last), routing (kernels/moe_route.py)
and the experts (kernels/moe_decode.py; the shared expert stacked as expert 256), for T = 1 and 8 tokens, int4
(G = 128) and bf16 experts. 40 layers, each with weights and inputs of its own (as in the model: no layer's experts
are still in L2), are replayed from one CUDA graph; per layer = the graph's time / 40. Bytes per layer: what it must
read (the router, the distinct experts its tokens chose, x) and write (out). Launches per layer: the kernels the
profiler sees in one eager layer. Baseline: the sorted torch loop (kernels/moe_sorted.py, eager: it syncs with the
host) over the same 40 layers. Then decode configs are swept at int4, T = 1 and 8, experts only (DEFAULT_CONFIG's
values were chosen without a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import ops
from kernels.bench import graph_replay, time_us
from kernels.moe_decode import DEFAULT_CONFIG, moe_decode
from kernels.moe_sorted import moe_sorted
from kernels.quant_format import Int4Weight

E, K_TOP, H, I, LAYERS, G = 256, 8, 2048, 512, 40, 128
DEV = "cuda"
SWEEP = [dict(GATE_UP_BN=32, GATE_UP_WARPS=2), dict(GATE_UP_BN=32, GATE_UP_WARPS=4),
         dict(GATE_UP_BN=64, GATE_UP_WARPS=4), dict(DOWN_BN=32, DOWN_WARPS=2), dict(DOWN_BN=64, DOWN_WARPS=4),
         dict(PER_SM=4), dict(PER_SM=16), dict(GATE_UP_PER=H // 128), dict(DOWN_PER=K_TOP + 1)]


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


def bench(kind: str) -> None:
    layers = _layers(kind)
    for T in (1, 8):
        xs = [torch.randn(T, H, device=DEV).bfloat16() for _ in layers]

        def route(i):
            return ops.moe_route(F.linear(xs[i], layers[i]["router"]), K_TOP, shared=True)

        routes = [route(i) for i in range(LAYERS)]       # what every run below routes (the same inputs)

        def experts(i, moe=ops.moe_experts, **config):
            w = layers[i]
            return moe(xs[i], *routes[i], w["gate_up"], w["down"], I, **config)

        def layer(i):
            w = layers[i]
            return ops.moe_experts(xs[i], *route(i), w["gate_up"], w["down"], I)

        nbytes = sum(_layer_bytes(w, ids, T) for w, (ids, _) in zip(layers, routes)) / LAYERS
        us = time_us(graph_replay(lambda: [layer(i) for i in range(LAYERS)])) / LAYERS
        _row(f"{kind} T={T} layer: router + route + experts [graph]", us, nbytes, _launches(lambda: layer(0)))
        us = time_us(graph_replay(lambda: [experts(i) for i in range(LAYERS)])) / LAYERS
        _row(f"{kind} T={T} experts [graph]", us, nbytes, _launches(lambda: experts(0)))
        us = time_us(lambda: [experts(i, moe_sorted) for i in range(LAYERS)]) / LAYERS
        _row(f"{kind} T={T} experts, sorted torch loop [eager, baseline]", us, nbytes,
             _launches(lambda: experts(0, moe_sorted)))
        if kind != "int4":
            continue
        for cfg in SWEEP:
            config = {**DEFAULT_CONFIG, **cfg}
            step = graph_replay(lambda config=config: [experts(i, moe_decode, config=config) for i in range(LAYERS)])
            _row(f"{kind} T={T} experts {cfg} [graph]", time_us(step) / LAYERS, nbytes)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("python -m kernels.bench_moe: needs a CUDA GPU")
    print(f"35B-A3B MoE layer: H {H}, I {I}, {E} experts + 1 shared (stacked), top {K_TOP}; {LAYERS} layers per "
          f"graph; decode config {DEFAULT_CONFIG}")
    print(f"{'case':64s} {'us/layer':>9s} {'MB/layer':>9s} {'GB/s':>8s} {'launches':>9s}")
    for kind in ("int4", "bf16"):
        bench(kind)
        torch.cuda.empty_cache()                          # (the bf16 layers take 65 GB)


if __name__ == "__main__":
    main()
