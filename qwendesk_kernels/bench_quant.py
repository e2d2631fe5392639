"""Weight-only int4 / int8 benchmarks at the 27B shapes (`python -m qwendesk_kernels.bench quant`).

GEMV cases (decode M = 1, C8 M = 8, verify M = 32) are counted by the bytes they must move: packed weights +
scales + zeros + activations in and out; the baseline is torch's bf16 F.linear on a bf16 weight of the same
shape, so "vs ref" is the speed-up over bf16. At M = 1 and 8 both int4 GEMV variants run: A (tensor-core dots,
autotuned: its config in the name as BN, warps, stages, split-K) and C (mma.sync on the words as they lie) with
each of its configs (gemv_mma.gemv_mma_configs: cfg1 is the default), each replayed from a CUDA graph (kernel time,
cold L2: the baseline replayed the same way) and the defaults also eager (plus the Python launch).
Cold L2 here means just after do_bench's L2 flush, whose dirty lines are written back while the case runs: these
GEMV numbers read low (bf16 cuBLAS included); the engine's decode step is the measure that counts. `layer` cases
replay one CUDA graph of the four projections of a GDN or full-attention layer, per variant (int4 against bf16).
`decode GEMVs` cases replay the 64 projections of 16 layers (12 GDN, 4 attention, each with weights of its own:
nothing stays in L2) from one graph, with and without programmatic dependent launch (qwendesk_kernels/pdl.py): the
closest to the decode step's GEMVs, and the L2 flush is small next to them.
Prefill cases (dequantise + cuBLAS) are counted by flops, with the issue's target of 60% of bf16's speed as a time
budget measured in the same run.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from qwendesk_kernels import gemv_dot, pdl
from qwendesk_kernels.bench import Case, graph_replay, time_us
from qwendesk_kernels.gemv_mma import GEMV_MMA_DEFAULT, MMA_ROWS, gemv_mma_configs, gemv_mma_grid
from qwendesk_kernels.quant import int4_linear, int4_linear_triton, int8_embedding, int8_linear
from qwendesk_kernels.quant_format import pack_int4, pack_int8

HIDDEN = 5120
PROJ = {                                         # (N, K) of the int4 projections
    "attn_qkv": (24 * 256 * 2 + 2 * 4 * 256, HIDDEN),
    "attn_o": (HIDDEN, 24 * 256),
    "gdn_in_qkvz": (2 * 2048 + 6144 + 6144, HIDDEN),
    "gdn_out": (HIDDEN, 6144),
    "mlp_gate_up": (2 * 17408, HIDDEN),
    "mlp_down": (HIDDEN, 17408),
}
LAYERS = {"gdn": ["gdn_in_qkvz", "gdn_out", "mlp_gate_up", "mlp_down"],
          "attn": ["attn_qkv", "attn_o", "mlp_gate_up", "mlp_down"]}
LM_HEAD = (248320, HIDDEN)
G = 128
DEV = "cuda"
GEMV_TARGET = ">= 80% of copy bw"


def _int4(N, K):
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=DEV)
    scales = (0.002 + 0.01 * torch.rand(N, K // G, device=DEV)).bfloat16()
    zeros = (15 * torch.rand(N, K // G, device=DEV)).bfloat16()
    return pack_int4(q, scales, zeros, G)


def _int8(N, K):
    q = torch.randint(-128, 128, (N, K), dtype=torch.int8, device=DEV)
    return pack_int8(q, (0.0002 + 0.001 * torch.rand(N, K // G, device=DEV)).bfloat16(), G)


def _weight_bytes(w) -> int:
    zeros = getattr(w, "zeros", None)
    return (w.qweight.numel() * w.qweight.element_size() + w.scales.numel() * w.scales.element_size()
            + (zeros.numel() * zeros.element_size() if zeros is not None else 0))


def _gemv_bytes(w, M) -> int:
    N, K = w.shape
    return _weight_bytes(w) + 2 * M * (N + K)


def _tuned(fn) -> str:
    """Run fn once (the autotuner picks its config) and describe the GEMV config it used."""
    fn()
    cfg = gemv_dot.gemv_tuned.best_config
    kw = cfg.kwargs
    return f"BN{kw['BN']} w{cfg.num_warps} s{cfg.num_stages} k{kw['SPLIT_K']}"


def _gemv_cases(int4_w, bf16_w):
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    cases = []
    for name, (N, K) in PROJ.items():
        w, wb = int4_w[name], bf16_w[name]
        for M in (1, 8, 32):
            x = torch.randn(M, K, dtype=torch.bfloat16, device=DEV)
            tag = f"int4 {name} M={M}"
            eager_bf16 = lambda x=x, wb=wb: F.linear(x, wb)  # noqa: E731
            variant_a = lambda x=x, w=w: int4_linear_triton(x, w, variant="A")  # noqa: E731
            kw: dict[str, Any] = dict(bytes=_gemv_bytes(w, M), target=GEMV_TARGET, target_frac=0.8)
            cases.append(Case("quant", f"{tag} [A {_tuned(variant_a)}, eager]", variant_a, baseline=eager_bf16, **kw))
            if M > MMA_ROWS:
                continue
            graph_bf16 = graph_replay(eager_bf16)
            cases.append(Case("quant", f"{tag} [A, graph]", graph_replay(variant_a), baseline=graph_bf16, **kw))
            for i, cfg in enumerate(gemv_mma_configs(), 1):
                variant_c = lambda x=x, w=w, cfg=cfg: int4_linear_triton(x, w, cfg, variant="C")  # noqa: E731
                programs, per = gemv_mma_grid(N, K, cfg, sms)
                name_c = (f"C cfg{i} NW{cfg['NW']} R{cfg['R']} U{cfg['UNROLL']} reg{cfg['MAXNREG']}"
                          f"{' XT' if cfg.get('XT') else ''} {programs}x{per}")
                cases.append(Case("quant", f"{tag} [{name_c}, graph]", graph_replay(variant_c), baseline=graph_bf16,
                                  **kw))
            cases.append(Case("quant", f"{tag} [C cfg1, eager]", partial(int4_linear_triton, x, w, variant="C"),
                              baseline=eager_bf16, **kw))
    return cases


def _lm_head_cases():
    w = _int8(*LM_HEAD)
    wb = torch.randn(LM_HEAD, dtype=torch.bfloat16, device=DEV)
    cases = []
    for M in (1, 8, 32):
        x = torch.randn(M, HIDDEN, dtype=torch.bfloat16, device=DEV)
        fn = lambda x=x: int8_linear(x, w)  # noqa: E731
        cases.append(Case("quant", f"int8 lm_head {LM_HEAD[0]}x{HIDDEN} M={M} [{_tuned(fn)}]", fn,
                          bytes=_gemv_bytes(w, M), baseline=partial(F.linear, x, wb), target=GEMV_TARGET,
                          target_frac=0.8))
    T = 8192
    ids = torch.randint(0, LM_HEAD[0], (T,), device=DEV)
    cases.append(Case("quant", f"int8 embedding T={T}", lambda: int8_embedding(ids, w),
                      bytes=T * HIDDEN * 3 + T * (HIDDEN // G) * 2, baseline=lambda: F.embedding(ids, wb),
                      target=">= 50% of copy bw", target_frac=0.5))
    return cases


def _layer_cases(int4_w, bf16_w):
    cases = []
    for kind, names in LAYERS.items():
        for M in (1, 8):
            xs = [torch.randn(M, PROJ[n][1], dtype=torch.bfloat16, device=DEV) for n in names]
            bf16_step = graph_replay(lambda xs=xs, names=names: [F.linear(x, bf16_w[n]) for x, n in zip(xs, names)])
            nbytes = sum(_gemv_bytes(int4_w[n], M) for n in names)
            for variant in ("A", "C"):
                int4_step = graph_replay(lambda xs=xs, names=names, variant=variant: [
                    int4_linear_triton(x, int4_w[n], variant=variant) for x, n in zip(xs, names)])
                cases.append(Case("quant", f"int4 {kind} layer, 4 projections, M={M} [{variant}, graph]", int4_step,
                                  bytes=nbytes, baseline=bf16_step, target=GEMV_TARGET + "; >= 2.8x bf16 (vs ref)",
                                  target_frac=0.8))
    return cases


def _step_cases():
    """The GEMVs of 16 decode layers in one graph, distinct weights per layer (~3 GB int4, ~12 GB bf16)."""
    names = [n for i in range(16) for n in LAYERS["attn" if i % 4 == 3 else "gdn"]]
    int4_ws = [_int4(*PROJ[n]) for n in names]
    bf16_ws = [torch.randn(PROJ[n], dtype=torch.bfloat16, device=DEV) for n in names]
    cases = []
    for M in (1, 8):
        xs = {K: torch.randn(M, K, dtype=torch.bfloat16, device=DEV) for _, K in PROJ.values()}
        bf16_step = graph_replay(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in bf16_ws])
        nbytes = sum(_gemv_bytes(w, M) for w in int4_ws)
        for with_pdl in (False, True):
            pdl.ENABLED = with_pdl                 # the launches are recorded with or without it at capture
            int4_step = graph_replay(lambda xs=xs: [int4_linear_triton(xs[w.shape[1]], w) for w in int4_ws])
            cases.append(Case("quant", f"int4 decode GEMVs of 16 layers, 64 launches, M={M} "
                              f"[graph, PDL {'on' if with_pdl else 'off'}]", int4_step, bytes=nbytes,
                              baseline=bf16_step, target=GEMV_TARGET + "; >= 2.8x bf16 (vs ref)", target_frac=0.8))
        pdl.ENABLED = True
        # fewer programs per SM leave room for the next GEMV's programs, which then load their first weights while
        # this one's last programs finish (with 16 per SM at 128 registers the register file is full until they exit)
        for per_sm in (8, 12):
            cfg = {**GEMV_MMA_DEFAULT, "PER_SM": per_sm}
            int4_step = graph_replay(lambda xs=xs, cfg=cfg: [int4_linear_triton(xs[w.shape[1]], w, cfg)
                                                             for w in int4_ws])
            cases.append(Case("quant", f"int4 decode GEMVs of 16 layers, 64 launches, M={M} [graph, PDL on, "
                              f"{per_sm} programs per SM]", int4_step, bytes=nbytes, baseline=bf16_step,
                              target=GEMV_TARGET + "; >= 2.8x bf16 (vs ref)", target_frac=0.8))
    return cases


def _prefill_cases(int4_w, bf16_w):
    cases = []
    for name, M in (("mlp_gate_up", 8192), ("mlp_down", 8192), ("mlp_gate_up", 512)):
        (N, K), w, wb = PROJ[name], int4_w[name], bf16_w[name]
        x = torch.randn(M, K, dtype=torch.bfloat16, device=DEV)
        bf16_us = time_us(lambda: F.linear(x, wb))
        cases.append(Case("quant", f"int4 prefill {name} {N}x{K} M={M}", partial(int4_linear, x, w),
                          flops=2 * M * N * K, baseline=partial(F.linear, x, wb),
                          target=f">= 60% of bf16 speed (<= {bf16_us / 0.6:.0f} us)", target_us=bf16_us / 0.6))
    return cases


def cases() -> list[Case]:
    int4_w = {name: _int4(N, K) for name, (N, K) in PROJ.items()}
    bf16_w = {name: torch.randn(N, K, dtype=torch.bfloat16, device=DEV) for name, (N, K) in PROJ.items()}
    return (_gemv_cases(int4_w, bf16_w) + _lm_head_cases() + _layer_cases(int4_w, bf16_w) + _step_cases()
            + _prefill_cases(int4_w, bf16_w))
