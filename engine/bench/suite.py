"""qwendesk-bench: the engine at real model shapes with random weights, against HF transformers.

    qwendesk-bench [--shape 27b] [--weights bf16|int4] [--no-hf] [--json out.json]

Measures, in one run on one GPU, on the path users get (the model with its MTP module, speculation as by default) and
with speculation off beside it: the copy-bandwidth ceiling; engine load time; prefill tok/s at 512 / 8K / 32K;
TTFT at 512; decode tok/s per stream and aggregate at C1 / C2 / C4 / C8; the second-turn TTFT
of a 4K-token conversation; then the same workloads through transformers' Qwen3_5ForCausalLM, or
Qwen3_5MoeForCausalLM for --shape 35b-a3b (with flash-linear-attention when importable; skipped with a note when
transformers, a test extra, is not installed). Prints ratios and the roofline fraction: the bytes a decode step
must read (weights + KV + GDN state; of an MoE model's routed experts, the ones its tokens chose) over the measured
copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from engine.bench.figures import (bench_engine, copy_bandwidth, decode_figures, prefill_figures, profile_decode, run,
                                  weight_bytes)
from engine.cache.kv_format import KVFormat
from engine.commands.args import Parser, positive_int
from engine.core.params import KV_DTYPES, PROFILES
from engine.bench.random_model import (SHAPES, bench_tokenizer, build_random_drafter, build_random_model, rand_ids,
                                       text_config)


SPEC_MODES = {"": None, "_spec_off": 0}     # key suffix -> speculative_tokens: the default path, and speculation off


def bench_ours(model, args, bw) -> dict:
    """Every figure on the path users get (the model with its MTP module, speculation as it is by default) and, beside
    it under keys ending in _spec_off, with speculation off; load_*_s: Engine.from_model's time (the round graphs'
    capture is the difference)."""
    res: dict[str, Any] = {}
    for suffix, drafts in SPEC_MODES.items():
        t0 = time.perf_counter()
        context = max(args.contexts + [4096 + 128]) + 1024        # + the turn workload
        eng = bench_engine(model, args, "C1", context, drafts)
        res[f"load_C1_s{suffix}"] = time.perf_counter() - t0
        for n in args.contexts:
            res.update({k + suffix: v for k, v in prefill_figures(eng, n).items()})
        run(eng, [rand_ids(4096, 9)], 64)                 # warm the turn workload's shapes
        first = run(eng, [rand_ids(4096, 7)], 64)[0]
        second = run(eng, [rand_ids(4096, 7) + list(range(1000, 1064)) + rand_ids(64, 8)], 1)[0]
        res[f"turn1_ttft_ms{suffix}"], res[f"turn2_ttft_ms{suffix}"] = first.timings.ttft_ms, second.timings.ttft_ms
        res[f"turn2_cached_tokens{suffix}"] = second.usage.cached_tokens
        eng.close()
        for profile in args.profiles:
            t0 = time.perf_counter()
            eng = bench_engine(model, args, profile, args.decode_prompt + args.decode_tokens + 64, drafts)
            res[f"load_{profile}_s{suffix}"] = time.perf_counter() - t0
            res.update({k + suffix: v for k, v in decode_figures(eng, model, profile, args, bw).items()})
            if drafts is None:
                res[f"spec_drafts_now_{profile}"] = eng.stats().get("spec_drafts_now", 0)
            eng.close()
    return res


def profile(model, out_dir: str) -> None:
    """Where a short prefill spends its time: the engine's TTFT at 512 tokens, then one 512-token forward of the
    model called directly (on pools of its own: 8 pages, 1 state slot): host issue time (until the Python call
    returns), wall time and GPU time (events), the top kernels, and the top Python functions (cProfile) of the host
    side."""
    import cProfile
    import os
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from engine.api import Engine, EngineConfig
    from engine.cache.pages import CacheTensors
    from engine.model.batch import build_batch
    from qwendesk_kernels import gdn
    eng = Engine.from_model(EngineConfig(model="", device="cuda", max_context=4096), model, bench_tokenizer())
    run(eng, [rand_ids(512, 1)], 16)                         # warm: compile, tune, capture
    ttft = [run(eng, [rand_ids(512, 2 + i)], 1)[0].timings.ttft_ms for i in range(3)]
    print(f"engine TTFT at 512 tokens: {', '.join(f'{t:.1f}' for t in ttft)} ms")

    pools = CacheTensors.allocate(model.cfg, 8, eng.config.page_size, 1, model.dtype, "cuda")
    ids = torch.tensor(rand_ids(512, 9), device="cuda")

    def forward():
        batch = build_batch([512], [0], [0], [list(range(8))], pools.page_size, "cuda")
        with torch.inference_mode():
            return model.logits(model(ids, batch, pools)[batch.logits_rows])

    default = gdn.RECURRENT_MAX_TOKENS
    for limit in (0, 512):                                  # GDN prefill by fla, then by the recurrent kernel
        gdn.RECURRENT_MAX_TOKENS = limit
        forward()
        torch.cuda.synchronize()
        for _ in range(3):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            begin.record()
            forward()
            end.record()
            issue = (time.perf_counter() - t0) * 1e3
            torch.cuda.synchronize()
            print(f"forward 512, GDN by {'fla' if limit == 0 else 'recurrent'}: host issue {issue:.1f} ms, "
                  f"wall {(time.perf_counter() - t0) * 1e3:.1f} ms, GPU (events) {begin.elapsed_time(end):.1f} ms")
    gdn.RECURRENT_MAX_TOKENS = default
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward()
        torch.cuda.synchronize()
    kernels = prof.key_averages()
    busy = sum(k.self_device_time_total for k in kernels) / 1e3
    print(f"kernels: {sum(k.count for k in kernels)} launches, {busy:.1f} ms busy")
    print(kernels.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
    host = cProfile.Profile()
    host.enable()
    forward()
    host.disable()
    torch.cuda.synchronize()
    os.makedirs(out_dir, exist_ok=True)
    host.dump_stats(os.path.join(out_dir, "prefill_host.pstats"))
    pstats.Stats(host).sort_stats("tottime").print_stats(20)
    profile_decode(eng)
    eng.close()


def bench_hf(raw_cfg, args) -> dict:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig
    moe = raw_cfg["model_type"].startswith("qwen3_5_moe")
    try:
        import fla  # noqa: F401
        kernels = "fla"
    except ImportError:
        kernels = "torch fallback"
    cfg = (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)(**{k: v for k, v in raw_cfg.items()
                                                                  if k != "model_type"})
    with torch.device("cuda"):
        hf = (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM)(cfg).to(torch.bfloat16).eval()
    res: dict[str, Any] = {"hf_kernels": kernels}

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.no_grad():
        ids = torch.tensor([rand_ids(512, 1)], device="cuda")
        timed(lambda: hf.generate(ids, max_new_tokens=2, do_sample=False))  # warm-up
        for n in args.hf_contexts:
            ids = torch.tensor([rand_ids(n, n)], device="cuda")
            hf(ids, use_cache=True, logits_to_keep=1)   # warm this length
            t = timed(lambda: hf(ids, use_cache=True, logits_to_keep=1))
            res[f"prefill_{n}_tok_s"] = n / t
        res["ttft_512_ms"] = 1e3 * 512 / res["prefill_512_tok_s"]
        for profile in args.profiles:
            c = int(profile[1:])
            ids = torch.tensor([rand_ids(args.decode_prompt, 300 + i) for i in range(c)], device="cuda")
            mask = torch.ones_like(ids)
            n = args.hf_decode_tokens
            gen_1 = lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False)  # noqa: E731
            gen_n = lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=n + 1,  # noqa: E731
                                        min_new_tokens=n + 1, do_sample=False)
            gen_1(), gen_n()   # warm this batch size
            t1, t2 = timed(gen_1), timed(gen_n)
            res[f"decode_{profile}_aggregate_tok_s"] = c * n / (t2 - t1)
            res[f"decode_{profile}_per_stream_tok_s"] = n / (t2 - t1)
    return res   # the model goes with this frame


def write_json(results: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def main(argv=None) -> int:
    ap = Parser(prog="qwendesk-bench")
    ap.add_argument("--shape", default="27b", choices=sorted(SHAPES))
    ap.add_argument("--contexts", default="512,8192,32768", type=token_counts, help="prefill lengths, comma-separated")
    ap.add_argument("--profiles", default="C1,C2,C4,C8", type=profile_names, help="decode profiles, comma-separated")
    ap.add_argument("--decode-prompt", type=positive_int, default=512)
    ap.add_argument("--decode-tokens", type=positive_int, default=128)
    ap.add_argument("--prefill-chunk", type=positive_int, default=8192)
    ap.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                    help="compare with HF transformers (bf16 weights; needs the transformers package)")
    ap.add_argument("--hf-contexts", default="512,8192", type=token_counts)
    ap.add_argument("--hf-decode-tokens", type=positive_int, default=16)
    ap.add_argument("--weights", default="bf16", choices=["bf16", "int4"])
    ap.add_argument("--simulate-gb", type=float, default=None,
                    help="instead of the speed runs: the memory scenarios of a card this size, the model loaded as "
                    "the app loads it (the planner's weights, MTP, the vision tower where the plan puts it)")
    ap.add_argument("--profile", metavar="DIR", help="instead of the speed runs: profile a 512-token prefill "
                    "(torch.profiler, cProfile of the host side into DIR) and the kernels of a decode step")
    ap.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                    help="programmatic dependent launch where the GPU has it (qwendesk_kernels/pdl.py); profile with "
                    "--no-pdl: with it a kernel's time includes its wait for the one before")
    ap.add_argument("--gemv-rows", default="warps", choices=["warps", "xt", "xt1", "dot"],
                    help="the int4 GEMV past 8 rows (a verify's; qwendesk_kernels/gemv_mma.py): the mma GEMV with a "
                    "column tile's own warps (warps, the default), with a pair of column tiles in each warp and two / "
                    "one weight tiles per warp (xt / xt1), or the dot GEMV past 16 rows (dot: not exact, a verify's "
                    "rows then differ in bits from a plain step's)")
    ap.add_argument("--draft-oracle", type=rates, metavar="P,...",
                    help="instead of the speed runs: speculative decoding with drafts right at these rates "
                    "(engine/bench/spec.py), per --profiles and --drafts")
    ap.add_argument("--drafts", default="1,3,5", type=token_counts, help="drafts per round (--draft-oracle)")
    ap.add_argument("--drafter", default="none", choices=["none", "random"],
                    help="(--draft-oracle or --simulate-gb, --shape 27b) draft with a random block drafter of the "
                    "published DFlash drafter's size instead of the MTP head")
    ap.add_argument("--spec-context", type=positive_int, default=512, help="prompt tokens (--draft-oracle)")
    ap.add_argument("--profile-rounds", action="store_true",
                    help="(--draft-oracle) also profile the rounds of the first rate by kernel, and at C1 the "
                    "verify of k + 1 rows against a one-row forward")
    ap.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                    help="(--draft-oracle) engines keep what they loaded out of the garbage collector's walks, as "
                    "every engine does by default (engine/core/collector.py); --no-gc-freeze measures without")
    ap.add_argument("--slow-stacks", action="store_true",
                    help="(--draft-oracle) sample the engine loop's Python stack every 2 ms and print, for each round "
                    "over twice its row's median, where the loop spent it (waiting on the GPU or in which host code)")
    ap.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES, help="KV cache of the engines measured")
    ap.add_argument("--moe-goals", action="store_true",
                    help="instead of the speed runs: issue 30's figures, the 35B-A3B int4 (C1 and C8 decode, prefill "
                    "8K, bytes per decode step, launches per step) against the 27B int4 in the same run "
                    "(engine/bench/moe.py)")
    ap.add_argument("--json-schema", metavar="FILE", help="instead of the speed runs: decode with this JSON schema "
                    "as a constraint against without, at --profiles (engine/bench/grammar.py; needs --tokenizer)")
    ap.add_argument("--tokenizer", metavar="DIR", help="a byte-level tokenizer's folder (--json-schema)")
    ap.add_argument("--cache-tiers", action="store_true",
                    help="instead of the speed runs: the host and disk cache tiers (engine/bench/tiers.py): next-turn "
                    "TTFT after a restart, warm vs cold, per KV dtype (--tiers-kv); restore bandwidth; decode during a "
                    "disk write")
    ap.add_argument("--tiers-context", type=positive_int, default=32768, help="conversation tokens (--cache-tiers)")
    ap.add_argument("--tiers-kv", default="int8,bf16", type=kv_dtypes,
                    help="KV dtypes, comma-separated (--cache-tiers)")
    ap.add_argument("--tiers-decode", action=argparse.BooleanOptionalAction, default=True,
                    help="(--cache-tiers) also decode during a background disk write")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.json_schema and not args.tokenizer:
        ap.error("--json-schema needs --tokenizer DIR (a folder with the model's tokenizer.json)")
    args.hf = args.hf and args.weights == "bf16" and not (args.simulate_gb or args.profile or args.json_schema
                                                                   or args.cache_tiers or args.moe_goals)
    if args.hf and (why := transformers_missing()):
        print(f"note: skipping the comparison with HF transformers ({why}); pip install transformers to run it")
        args.hf = False
    if not torch.cuda.is_available():
        ap.exit(2, f"{ap.prog}: error: needs a CUDA GPU; none is available\n")
    from qwendesk_kernels import gemv_mma, pdl
    pdl.ENABLED = args.pdl
    rows_configs: dict[str, dict] = {"xt": gemv_mma.GEMV_MMA_XT, "xt1": gemv_mma.GEMV_MMA_XT1}
    gemv_mma.ROWS_CONFIG = rows_configs.get(args.gemv_rows)
    gemv_mma.DOT_PAST = 2 * gemv_mma.X_TILE if args.gemv_rows == "dot" else None

    raw = text_config(args.shape)
    if args.simulate_gb:
        from engine.bench.memory import simulate
        results = simulate(args.shape, args.simulate_gb, drafter=args.drafter == "random")
        write_json(results, args.json)
        return 0
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s; shape {args.shape}; "
          f"weights {args.weights}", flush=True)
    results = {"shape": args.shape, "copy_tbps": bw / 1e12, "weights": args.weights}
    if args.moe_goals:
        from engine.bench import moe as bench_moe
        results.update(bench_moe.bench_goals(args, bw), shape="35b-a3b vs 27b", weights="int4")
        bench_moe.report(results)
        write_json(results, args.json)
        return 0
    if args.draft_oracle:
        from engine.bench import spec as bench_spec
        drafter = build_random_drafter(args.shape, args.weights) if args.drafter == "random" else None
        results.update(bench_spec.bench_speculation(build_random_model(raw, args.weights, mtp=drafter is None), args,
                                                    drafter), drafter=args.drafter)
        bench_spec.report(results)
        write_json(results, args.json)
        return 0
    model = build_random_model(raw, args.weights, mtp=True)     # as users load it: with its MTP module
    if args.cache_tiers:
        from engine.bench import tiers as bench_tiers
        results.update(bench_tiers.bench_tiers(model, args))
        bench_tiers.report(results)
        write_json(results, args.json)
        return 0
    if args.json_schema:
        from engine.bench import grammar as bench_grammar
        results.update(bench_grammar.bench_grammar(model, args))
        bench_grammar.report(results)
        write_json(results, args.json)
        return 0
    if args.profile:
        profile(model, args.profile)
        return 0
    results["weight_gb"] = weight_bytes(model) / 1e9
    results["ours"] = bench_ours(model, args, bw)
    del model
    torch.cuda.empty_cache()
    if args.hf:
        results["hf"] = bench_hf(raw, args)
    report(results)
    write_json(results, args.json)
    return 0


def rates(value: str) -> list[float | tuple[float, ...]]:
    """argparse type: "1,0.82,0.93/0.81/0.64" -> [1.0, 0.82, (0.93, 0.81, 0.64)], each in [0, 1]; a / list gives a
    rate per draft position."""
    try:
        out = [float(p) if "/" not in p else tuple(float(x) for x in p.split("/")) for p in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of rates: {value!r}") from None
    if not all(0 <= x <= 1 for p in out for x in (p if isinstance(p, tuple) else [p])):
        raise argparse.ArgumentTypeError(f"rates are between 0 and 1: {value!r}")
    return out


def token_counts(value: str) -> list[int]:
    """argparse type: "512,8192" -> [512, 8192]."""
    return [positive_int(n) for n in value.split(",")]


def kv_dtypes(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    formats = [kv.value for kv in KVFormat]
    bad = [v for v in names if v not in formats]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{bad[0] if bad else value!r} is not a KV dtype ({', '.join(formats)})")
    return names


def profile_names(value: str) -> list[str]:
    """argparse type: "C1,C4" -> ["C1", "C4"]."""
    names = value.split(",")
    for name in names:
        if name not in PROFILES:
            raise argparse.ArgumentTypeError(f"{name!r} is not a profile ({', '.join(PROFILES)})")
    return names


def transformers_missing() -> str | None:
    """Why the comparison with HF transformers cannot run (transformers is only a test extra), or None."""
    try:
        from transformers import Qwen3_5ForCausalLM  # noqa: F401
    except ImportError as e:
        return str(e).splitlines()[0]
    return None


def report(r: dict) -> None:
    ours, hf = r["ours"], r.get("hf", {})
    print(f"\nweights read per decode step: {r['weight_gb']:.2f} GB; copy bandwidth {r['copy_tbps']:.2f} TB/s")
    print("ours: the default path (MTP module loaded, speculation as by default; random weights: drafts are never "
          "right, so the drafts policy should settle on plain steps); spec off: speculative_tokens=0")
    print(f"{'metric':40s} {'ours':>10s} {'spec off':>10s} {'on/off':>7s} {'HF':>10s} {'ours/HF':>8s} {'roofline':>9s}")
    for key, val in ours.items():
        if key.endswith(("roofline_tok_s", "_spec_off")) or not isinstance(val, float):
            continue
        off, other = ours.get(key + "_spec_off"), hf.get(key)
        lower = "ms" in key or key.endswith("_s")          # times: lower is better
        ratio = f"{(other / val if lower else val / other):7.1f}x" if other else "        "
        on_off = f"{val / off:6.2f}x" if off else "       "
        roof = ""
        if key.startswith("decode_") and key.endswith("aggregate_tok_s"):
            roof = f"{100 * val / ours[key.replace('aggregate', 'roofline')]:7.1f}%"
        print(f"{key:40s} {val:10.1f} {off if off else float('nan'):10.1f} {on_off} "
              f"{other if other else float('nan'):10.1f} {ratio} {roof:>9s}")
    print(f"turn-2 TTFT / turn-1 TTFT: {ours['turn2_ttft_ms'] / ours['turn1_ttft_ms']:.2f} "
          f"({ours['turn2_cached_tokens']} tokens reused); HF kernels: {hf.get('hf_kernels', '-')}; drafts per "
          f"round at the end of each decode run: "
          f"{ {k[16:]: v for k, v in ours.items() if k.startswith('spec_drafts_now_')} }")


if __name__ == "__main__":
    sys.exit(main())
