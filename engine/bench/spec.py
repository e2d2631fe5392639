"""Speculative decoding at real shapes with random weights: `qwendesk-bench --draft-oracle 1,0.9,0.82,0.6,0.3,0`.

Random weights predict nothing, so drafts come from a DraftOracle (engine/bench/oracle.py): draft j is the true greedy
continuation, from a plain run of the same prompt, with probability P if the drafts before it were, else a wrong
token; a round then yields 1 + P + ... + P^k tokens on average (P = 0.82, k = 3: 3.04, the 3090 reference engine's
measured figure). The MTP layer still runs, so every cost is real. Per profile: plain greedy runs (the reference
output and plain tok/s), then per k and P two speculative runs whose output must equal the plain one, with their
tokens per round, round time and tok/s: the drafts policy off (every round drafts k) and on (the default path: the
policy picks 0..k drafts per step from measured step times and acceptance). Every run starts with its prompts in the
prefix cache, so tok/s compares decoding, not a prefill that only the first run pays. Components, at C1: a plain decode
step, one draft step (MTP row + draft head), one verify forward of k + 1 rows (main model + full head), each replayed
from a CUDA graph of its own.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from engine.bench.random_model import bench_tokenizer, rand_ids
from engine.bench.round_timing import (full_collections, loop_stacks, quartiles, round_gpu_times, slow_stacks,
                                       timed_rounds)


def _generate(eng, prompts, n):
    """Greedy runs of all prompts at once: (outputs, aggregate decode tok/s, finish events). The aggregate is the sum
    of each stream's rate from its first token to its last: the streams' prefills, admitted one after another, stay
    out of it (a span from the first first token to the last finish counted them at C8)."""
    from engine.api import SamplingParams
    handles = [eng.submit(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)) for p in prompts]
    outs, fins = [], []
    for h in handles:
        ids = []
        for ev in h:
            ids += ev.token_ids
            if ev.kind == "finish":
                fins.append(ev)
        outs.append(ids)
    return outs, sum(f.timings.decode_tok_s for f in fins), fins


def _graph(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph (after two eager runs: autotuning, allocations)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    return graph


def _graph_ms(fn, iters: int = 30) -> float:
    graph = _graph(fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _kernel_us(fn, iters: int = 20) -> dict[str, float]:
    """GPU time per replay of fn's graph by kernel name (us; CUPTI sees the kernels inside a graph)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    graph = _graph(fn)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            graph.replay()
        torch.cuda.synchronize()
    return {k.key: k.self_device_time_total / iters for k in prof.key_averages() if k.self_device_time_total > 0}


def components(eng, k: int, context: int, profile: bool = False) -> dict:
    """Times of one draft step and one verify forward of k + 1 rows for one sequence at `context` tokens (CUDA graphs
    of their own over the engine's model and pools, on the scratch slot). They write their K / V into free pages.
    profile: also each kernel's time in a one-row forward and in the verify (`print_verify_profile`)."""
    from engine.spec.rounds import RoundRequest, round_inputs, rows_batch
    spec, cache = eng._spec.spec, eng._cache
    model, pools, page = spec.model, spec.pools, cache.page_size
    need = -(-(context + max(k + 1, spec.reach_of(k))) // page)
    pages = cache.free_pages[:need]           # free pages, the last ones the cache would hand out
    req = RoundRequest(cache.scratch_slot, context, 1, pages, len(pages) * page, cache.scratch_slot)    # greedy
    inp = round_inputs([req], eng._spec.max_pages, pools.conv.device)

    def draft():
        if spec.method == "dflash":     # the whole block, over `context` keys
            spec.pick(*spec.draft_rows(inp, k), inp, False)
            return
        m = model.mtp_forward(inp.last, spec.draft_hidden[inp.slots], rows_batch(inp, 0, 1, page, spec.max_seq_len),
                              pools)
        spec.draft_logits(m).argmax(-1)

    def forward(n: int):
        """The main model over n rows and the full head: a plain step's forward (n = 1) or a verify's."""
        rows = spec.rows.first(1, n) if n > 1 else None
        return lambda: model.logits(model(inp.last.repeat(n), rows_batch(inp, 0, n, page, spec.max_seq_len,
                                                                          verify=rows), pools))

    with torch.inference_mode():
        out: dict[str, Any] = {"draft_ms": _graph_ms(draft), "verify_ms": _graph_ms(forward(k + 1))}
        if profile:
            out["kernels_1"], out[f"kernels_{k + 1}"] = _kernel_us(forward(1)), _kernel_us(forward(k + 1))
        return out


def print_verify_profile(comp: dict, k: int) -> None:
    """Where a verify of k + 1 rows spends its time beyond a one-row forward, kernel by kernel (largest growth
    first)."""
    one, many = comp["kernels_1"], comp[f"kernels_{k + 1}"]
    names = sorted(set(one) | set(many), key=lambda n: one.get(n, 0.0) - many.get(n, 0.0))
    print(f"verify profile: 1 row {sum(one.values()):.0f} us, {k + 1} rows {sum(many.values()):.0f} us of kernels",
          flush=True)
    for name in names[:25]:
        a, b = one.get(name, 0.0), many.get(name, 0.0)
        print(f"  {a:8.1f} us -> {b:8.1f} us  (+{b - a:7.1f})  {name[:100]}", flush=True)


def bench_speculation(model, args, drafter=None) -> dict:
    """The table of module docstring: rows of dict per (profile, k, P). drafter: a block drafter the speculative
    engines draft with (attached to the model for them only: the plain engine's forwards write no drafter context)."""
    from engine.api import Engine, EngineConfig
    from engine.bench.oracle import DraftOracle
    tok = bench_tokenizer()
    out: dict[str, Any] = {"rows": []}

    device = next(model.parameters()).device.type

    def engine(profile, ctx, k):
        model.drafter = drafter if k else None
        return Engine.from_model(EngineConfig(model="", device=device, profile=profile, max_context=ctx,
                                              prefill_chunk=args.prefill_chunk, max_queue=16, speculative_tokens=k,
                                              kv_dtype=args.kv_dtype), model, tok, freeze_gc=args.gc_freeze)

    for profile in args.profiles:
        c = int(profile[1:])
        prompt_len = args.spec_context
        prompts = [rand_ids(prompt_len, 300 + i) for i in range(c)]
        ctx = prompt_len + args.decode_tokens + 64
        t0 = time.perf_counter()
        eng = engine(profile, ctx, 0)
        plain_load_s = time.perf_counter() - t0
        _generate(eng, prompts, 8)          # warm this batch size; the prompts in the prefix cache, as for every row
        # twice: the C8 baseline has moved 521-730 tok/s between engines while the speculative engine's own plain
        # steps held ~890; the faster run is the baseline (the ratios' conservative side), both are printed
        (plain, first_rate, _), (again, again_rate, _) = (_generate(eng, prompts, args.decode_tokens) for _ in range(2))
        eng.close()
        assert again == plain, "greedy plain runs of the same prompts differ"
        plain_rate = max(first_rate, again_rate)
        step_ms = 1e3 / (plain_rate / c)
        out[f"plain_{profile}_tok_s"], out[f"plain_{profile}_step_ms"] = plain_rate, step_ms
        out[f"plain_{profile}_runs_tok_s"] = [round(first_rate, 1), round(again_rate, 1)]
        print(f"{profile} plain: {plain_rate:.1f} tok/s (the faster of {first_rate:.1f} and {again_rate:.1f}), "
              f"step {step_ms:.2f} ms", flush=True)
        runs = {tuple(p): p + o for p, o in zip(prompts, plain)}
        for k in args.drafts:
            t0 = time.perf_counter()
            eng = engine(profile, ctx, k)
            out[f"load_{profile}_k{k}_s"] = load_s = time.perf_counter() - t0
            print(f"{profile} k={k}: load {load_s:.1f} s (plain {plain_load_s:.1f} s; the rounds' capture at load)",
                  flush=True)
            most = eng.stats()["spec_drafts_most"].get(c, k)
            if most < k:
                print(f"{profile} k={k}: rounds make at most {most} drafts here (a verify of {c} x (k + 1) rows "
                      f"stays within the rows whose bits equal a plain step's: engine/spec/speculation.py)", flush=True)
            if c == 1:
                comp = components(eng, k, prompt_len, args.profile_rounds)
                out[f"draft_{profile}_k{k}_ms"], out[f"verify_{profile}_k{k}_ms"] = comp["draft_ms"], comp["verify_ms"]
                print(f"{profile} k={k}: draft step {comp['draft_ms']:.3f} ms ({comp['draft_ms'] / step_ms:.3f}x a "
                      f"step), verify of {k + 1} rows {comp['verify_ms']:.3f} ms "
                      f"({comp['verify_ms'] / step_ms:.3f}x)", flush=True)
                if args.profile_rounds:
                    print_verify_profile(comp, k)
            _generate(eng, prompts, 1)   # the prompts in the prefix cache, as for plain (one token: no round runs)
            for p, adaptive in [(p, a) for p in args.draft_oracle for a in (False, True)]:
                oracle = DraftOracle(p, runs)
                eng.set_draft_oracle(oracle, adaptive=adaptive)
                before, retries = eng.stats(), torch.cuda.memory_stats().get("num_alloc_retries", 0)
                with timed_rounds(eng) as rounds_, full_collections() as pauses, \
                        loop_stacks(eng, on=args.slow_stacks) as stacks:
                    outs, rate, fins = _generate(eng, prompts, args.decode_tokens)
                alone = [r for r in rounds_ if not r.beside_prefill]
                spans = [(r.start, r.end) for r in alone]
                times = [1e3 * (t1 - t0) for t0, t1 in spans]
                median = statistics.median(times) if times else 0.0
                slow = [span for span, ms in zip(spans, times) if ms > 2 * median]
                after = eng.stats()
                rounds = after["spec_rounds"] - before["spec_rounds"]
                by_drafts = [b - a for a, b in zip(before["spec_steps_by_drafts"], after["spec_steps_by_drafts"])]
                row = dict(profile=profile, k=k, p=p, adaptive=adaptive, tok_s=rate, vs_plain=rate / plain_rate,
                           exact=outs == plain, rounds=rounds,
                           tokens_per_round=sum(f.usage.speculation.tokens_per_round for f in fins
                                                if f.usage.speculation) / c,
                           round_ms=c * (after["spec_round_ms_total"] - before["spec_round_ms_total"])
                           / max(rounds, 1),   # rounds counts each sequence's
                           round_ms_quartiles=quartiles(times), first_round_ms=times[0] if times else 0.0,
                           rounds_beside_prefill=len(rounds_) - len(alone),
                           followed=after["spec_rounds_followed"] - before["spec_rounds_followed"],
                           slow_rounds=len(slow), slow_rounds_in_gc=sum(any(p0 < t1 and t0 < p1 for p0, p1 in pauses)
                                                                        for t0, t1 in slow),
                           gc_full=len(pauses), gc_full_max_ms=max((1e3 * (p1 - p0) for p0, p1 in pauses), default=0.0),
                           **round_gpu_times(alone),
                           alloc_retries=torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries,
                           steps_by_drafts=by_drafts, policy_tok_s=after["spec_policy_tok_s"],
                           expected_tokens_per_round=sum(n * oracle.expected_tokens(j) for j, n in
                                                         enumerate(by_drafts) if j) / max(sum(by_drafts[1:]), 1))
                out["rows"].append(row)
                print(row, flush=True)
                for line in slow_stacks(slow, stacks):
                    print("  slow round:", line, flush=True)
            if args.profile_rounds:
                eng.set_draft_oracle(DraftOracle(args.draft_oracle[0], runs), adaptive=False)
                profile_rounds(eng, prompts, args.decode_tokens)
            eng.close()
    return out


def profile_rounds(eng, prompts, n: int) -> None:
    """GPU time per speculative round by kernel (CUPTI sees the kernels inside the round's CUDA graph): the run's
    kernels over its rounds (prefill included, a small share at short prompts), and the wall time per round."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    totals: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    before = eng.stats()["spec_rounds"]
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        _generate(eng, prompts, n)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rounds = (eng.stats()["spec_rounds"] - before) / len(prompts)   # the batch's rounds
    for k in prof.key_averages():
        totals[k.key][0] += k.self_device_time_total
        totals[k.key][1] += k.count
    busy = sum(us for us, _ in totals.values())
    print(f"{len(prompts)} sequences, {rounds:.0f} rounds: wall {wall / rounds * 1e3:.2f} ms per round, kernels "
          f"{busy / rounds / 1e3:.2f} ms busy, {sum(c for _, c in totals.values()) / rounds:.0f} launches", flush=True)
    for name, (us, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:20]:
        print(f"  {us / rounds:8.1f} us  {count / rounds:6.1f}x  {name[:90]}", flush=True)


def report(r: dict) -> None:
    """The rows' table. expect: the tokens a round yields on average at the oracle's P for the drafts the rounds made
    (a short run's own mean strays from it by chance: compare rows at the expectation); steps by k: decode steps
    with k drafts each, k = 0 (plain) first; first, median, max: of the rounds' spans (a stream's wait per round;
    rounds beside a prefill chunk left out); launch, gpu, idle: round_gpu_times' medians; follow: rounds launched
    before the one in flight was read; slow (gc): rounds over twice the row's median, and how many of them a full
    garbage collection overlapped; gc ms: the longest full collection in the row (how many ran)."""
    print(f"\n{'profile':7s} {'k':>2s} {'P':>14s} {'adapt':>5s} {'tok/s':>8s} {'x plain':>7s} {'tok/rnd':>7s} "
          f"{'expect':>6s} {'round ms':>8s} {'first':>7s} {'median':>7s} {'max':>7s} {'launch':>6s} {'gpu':>6s} "
          f"{'idle':>5s} {'follow':>6s} {'slow (gc)':>9s} {'gc ms (n)':>10s} exact  steps by k")
    for row in r["rows"]:
        p = row["p"] if isinstance(row["p"], float) else "/".join(f"{x:.2f}" for x in row["p"])
        q = row["round_ms_quartiles"]
        slow = f"{row['slow_rounds']} ({row['slow_rounds_in_gc']})"
        gc_ms = f"{row['gc_full_max_ms']:.1f} ({row['gc_full']})"
        print(f"{row['profile']:7s} {row['k']:2d} {p:>14} {str(row['adaptive']):>5s} {row['tok_s']:8.1f} "
              f"{row['vs_plain']:7.2f} {row['tokens_per_round']:7.2f} {row['expected_tokens_per_round']:6.2f} "
              f"{row['round_ms']:8.2f} {row['first_round_ms']:7.2f} {q[2]:7.2f} {q[4]:7.2f} {row['launch_ms']:6.2f} "
              f"{row['gpu_ms']:6.2f} {row['idle_ms']:5.2f} {row['followed']:6d} {slow:>9s} {gc_ms:>10s} "
              f"{str(row['exact']):5s}  {row['steps_by_drafts']}")
    print({k: round(v, 3) for k, v in r.items() if isinstance(v, float)})

