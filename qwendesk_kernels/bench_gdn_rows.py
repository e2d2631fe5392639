"""A GDN verify's rows against plain steps (`python -m qwendesk_kernels.bench_gdn_rows [--against FILE]`), at the 27B
shape with b|a projected and the gated norm applied as the int4 model runs them (fused up to two sequences):
1) a verify of L rows gives the bits of L plain one-token steps, and a replay of its rows leaves their state (what
   exact speculation rests on), a few random draws each, where tests/test_kernels_gdn.py's GPU test takes one;
2) 48 layers' steps in one CUDA graph, us, L = 1..16 rows.
--against: another version of qwendesk_kernels/gdn.py (a file) checked and timed beside this one, in one process;
--check / --time: the shapes (B x L) to check and to time (each a compile per version: a cold machine takes seconds)."""

from __future__ import annotations

import argparse
import importlib.util

import torch

from qwendesk_kernels import gdn
from qwendesk_kernels.bench import graph_replay, time_us

HK, HV, K, V, H, W = 16, 48, 128, 128, 5120, 4
C = 2 * HK * K + HV * V
LAYERS = 48
DEV = "cuda"


def _load(path: str):
    spec = importlib.util.spec_from_file_location("gdn_against", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layer(B: int, L: int) -> dict:
    """gdn_decode_triton's arguments for B sequences of L rows (a verify when L > 1)."""
    T = B * L
    return dict(qkv=torch.randn(T, C, dtype=torch.bfloat16, device=DEV), a=None, b=None,
                conv_weight=0.5 * torch.randn(C, W, dtype=torch.bfloat16, device=DEV),
                conv_state=torch.randn(B + 2, W - 1, C, dtype=torch.bfloat16, device=DEV),
                A_log=torch.empty(HV, device=DEV).uniform_(0.05, 4).log(), dt_bias=0.5 * torch.randn(HV, device=DEV),
                ssm_state=0.1 * torch.randn(B + 2, HV, K, V, device=DEV), slots=torch.randperm(B + 2, device=DEV)[:B],
                has_state=torch.ones(B, dtype=torch.bool, device=DEV),
                ba_proj=(torch.randn(T, H, dtype=torch.bfloat16, device=DEV),
                         0.02 * torch.randn(2 * HV, H, dtype=torch.bfloat16, device=DEV)),
                norm=(torch.randn(T, HV, V, dtype=torch.bfloat16, device=DEV),
                      torch.rand(V, device=DEV, dtype=torch.bfloat16) + 0.5, 1e-6),
                verify=gdn.VerifyRows.allocate(1, B, L, C, HV, torch.bfloat16, DEV).layer(0) if L > 1 else None)


def _differing(module, x: dict, B: int, L: int) -> tuple[int, int]:
    """(outputs, state elements) of a verify, and of a replay of all its rows, that differ from L plain steps'
    over the same pools' copies."""
    verify_rows = module.VerifyRows.allocate(1, B, L, C, HV, torch.bfloat16, DEV)
    verify = module.gdn_decode_triton(**dict(x, conv_state=x["conv_state"].clone(), ssm_state=x["ssm_state"].clone(),
                                             verify=verify_rows.layer(0)))
    conv, ssm = x["conv_state"].clone(), x["ssm_state"].clone()
    (h, w_ba), (z, w, eps) = x["ba_proj"], x["norm"]
    plain = torch.empty_like(verify)
    for t in range(L):
        rows = [i * L + t for i in range(B)]
        plain[rows] = module.gdn_decode_triton(x["qkv"][rows], None, None, x["conv_weight"], conv, x["A_log"],
                                               x["dt_bias"], ssm, x["slots"], x["has_state"], None, (h[rows], w_ba),
                                               (z[rows], w, eps))
    conv_r, ssm_r = x["conv_state"].clone()[None], x["ssm_state"].clone()[None]
    module.gdn_replay_triton(conv_r, ssm_r, x["slots"], torch.full((B,), L, dtype=torch.int32, device=DEV),
                             verify_rows)
    slots = x["slots"]
    return int((verify != plain).sum().item()), int((ssm_r[0][slots] != ssm[slots]).sum().item())


def _graph_us(module, B: int, L: int) -> float:
    layers = [_layer(B, L) for _ in range(LAYERS)]

    def run():
        for x in layers:
            module.gdn_decode_triton(**x)
    return time_us(graph_replay(run))


def _shapes(text: str) -> list[tuple[int, int]]:
    """"1x8,8x6" -> [(1, 8), (8, 6)]: B sequences of L rows."""
    return [tuple(int(n) for n in shape.split("x")) for shape in text.split(",")]   # type: ignore[misc]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qwendesk_kernels.bench_gdn_rows", description=__doc__.split("\n")[0])
    ap.add_argument("--against", metavar="FILE", action="append", default=[],
                    help="another gdn.py, checked and timed beside this one (repeatable)")
    ap.add_argument("--draws", type=int, default=3, help="random inputs per shape for the bit check")
    ap.add_argument("--check", type=_shapes, default=_shapes("1x4,1x8,1x16,2x6,8x6"), help="BxL shapes to check")
    ap.add_argument("--time", type=_shapes, default=_shapes("1x1,1x4,1x8,1x16,8x1,8x6"), help="BxL shapes to time")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU; none is available")
    versions = {"main": gdn, **{path.rsplit("/", 1)[-1]: _load(path) for path in args.against}}
    torch.manual_seed(0)
    exact = True
    for B, L in args.check:
        for draw in range(args.draws):
            x = _layer(B, L)
            for name, module in versions.items():
                n, n_state = _differing(module, x, B, L)
                exact &= n == n_state == 0 or name != "main"
                print(f"B={B} L={L:2d} draw {draw} {name:12s}: {n} of {B * L * HV * V} outputs and {n_state} of "
                      f"{B * HV * K * V} state elements after a replay differ from plain steps", flush=True)
    print(f"{'B':>2s} {'L':>2s} " + " ".join(f"{name + ' us':>15s}" for name in versions) + f"   ({LAYERS} layers)")
    for B, L in args.time:
        times = [_graph_us(module, B, L) for module in versions.values()]
        print(f"{B:2d} {L:2d} " + " ".join(f"{t:15.1f}" for t in times), flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
