"""`qwendesk-bench --moe-goals`: issue 30's figures in one run on one GPU, random weights, int4 as on a 24 GB card.

The 35B-A3B: decode at C1 and C8 (aggregate tok/s), the prefill of an 8K prompt, the bytes a decode step reads (the
weights but the embedding table and the experts no token chose: under the uniform routing of random weights a layer
reads E (1 - (1 - k / E)^tokens) of its E experts; plus KV and GDN state), and where a C1 decode step's time goes
(engine.bench.figures.profile_decode, on an engine of its own without PDL, which would count a kernel's wait for the one
before as its own time: the step's wall time against its kernels' busy time; the rest is launch overhead and the
gaps between kernels). Then, the 35B-A3B freed, the 27B int4's C1 decode and 8K prefill in the same process,
and the table of the issue's ratios against their goals.
"""

from __future__ import annotations

import gc

import torch

from engine.bench.figures import (bench_engine, decode_figures, prefill_figures, profile_decode, step_bytes,
                                  weight_bytes)
from engine.bench.random_model import build_random_model, text_config
from qwendesk_kernels import pdl

PREFILL = 8192
GOALS = [   # figure, numerator (shape, key), denominator (shape, key), goal
    ("C1 decode: 35B-A3B / 27B", ("35b-a3b", "decode_C1_aggregate_tok_s"), ("27b", "decode_C1_aggregate_tok_s"), 2.5),
    ("C8 aggregate / C1: 35B-A3B", ("35b-a3b", "decode_C8_aggregate_tok_s"), ("35b-a3b", "decode_C1_aggregate_tok_s"),
     4.0),
    ("prefill 8K: 35B-A3B / 27B", ("35b-a3b", f"prefill_{PREFILL}_tok_s"), ("27b", f"prefill_{PREFILL}_tok_s"), 2.0),
]


def measure(shape: str, profiles: list[str], args, bw, profile_step: bool) -> dict:
    model = build_random_model(text_config(shape), "int4")
    res = {"weight_gb": weight_bytes(model) / 1e9}
    for profile in profiles:       # C1 first: its engine also prefills
        c = int(profile[1:])
        eng = bench_engine(model, args, profile, PREFILL + 1024 if c == 1 else
                           args.decode_prompt + args.decode_tokens + 64)
        if c == 1:
            res.update(prefill_figures(eng, PREFILL))
        res.update(decode_figures(eng, model, profile, args, bw))
        eng.close()
        weights, cache = step_bytes(model, c, args)
        res[f"step_{profile}_weights_gb"], res[f"step_{profile}_kv_state_gb"] = weights / 1e9, cache / 1e9
    if profile_step:
        pdl.ENABLED, was = False, pdl.ENABLED
        eng = bench_engine(model, args, "C1", args.decode_prompt + args.decode_tokens + 64)
        res.update({f"{k}_C1": v for k, v in profile_decode(eng).items()})
        eng.close()
        pdl.ENABLED = was
    del model, eng
    gc.collect()
    torch.cuda.empty_cache()
    return res


def bench_goals(args, bw) -> dict:
    out = {}
    for shape, profiles in (("35b-a3b", ["C1", "C8"]), ("27b", ["C1"])):
        print(f"{shape}, int4: building and measuring ({', '.join(profiles)}, prefill {PREFILL})", flush=True)
        out[shape] = measure(shape, profiles, args, bw, profile_step=shape == "35b-a3b")
        print(shape, {k: round(v, 2) for k, v in out[shape].items() if "tok_s" in k or "ms" in k}, flush=True)
    return out


def report(r: dict) -> None:
    moe, dense = r["35b-a3b"], r["27b"]
    print(f"\n{'35B-A3B int4 vs 27B int4':28s} {'35B-A3B':>10s} {'27B':>10s}")
    for key in ("decode_C1_aggregate_tok_s", "decode_C8_aggregate_tok_s", f"prefill_{PREFILL}_tok_s",
                f"ttft_{PREFILL}_ms", "weight_gb"):
        print(f"{key:28s} {moe.get(key, float('nan')):10.1f} {dense.get(key, float('nan')):10.1f}")
    print(f"\n{'figure':30s} {'ratio':>7s} {'goal':>6s}  met")
    for name, (a_shape, a_key), (b_shape, b_key), goal in GOALS:
        ratio = r[a_shape][a_key] / r[b_shape][b_key]
        print(f"{name:30s} {ratio:6.2f}x {goal:5.1f}x  {'yes' if ratio >= goal else 'NO'}")
    for profile in ("C1", "C8"):
        roof = moe[f"decode_{profile}_aggregate_tok_s"] / moe[f"decode_{profile}_roofline_tok_s"]
        print(f"35B-A3B decode step at {profile}: reads {moe[f'step_{profile}_weights_gb']:.2f} GB of weights (of "
              f"{moe['weight_gb']:.2f} held) + {moe[f'step_{profile}_kv_state_gb']:.3f} GB of KV and GDN state; "
              f"{100 * roof:.1f}% of the copy-bandwidth roofline")
    wall, busy, launches = moe["step_wall_ms_C1"], moe["step_busy_ms_C1"], moe["step_launches_C1"]
    print(f"35B-A3B C1 decode step: wall {wall:.2f} ms, kernels busy {busy:.2f} ms, {launches:.0f} launches: "
          f"{100 * (1 - busy / wall):.0f}% of the step is launches and gaps "
          f"({1e3 * (wall - busy) / max(launches, 1):.1f} us per launch)")
