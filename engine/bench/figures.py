"""The figures of one engine run at real shapes with random weights (qwendesk-bench's and its MoE goals'): the copy
bandwidth, prefill and decode rates, the bytes a decode step must read (the roofline), and a decode step's kernels."""

from __future__ import annotations

import time

import torch

from engine.bench.random_model import bench_tokenizer, rand_ids


def copy_bandwidth() -> float:
    n = 1 << 30
    src = torch.randn(n // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 20 * 2 * n / (time.perf_counter() - t)


def weight_bytes(model) -> int:
    """Bytes a plain decode step reads from the weights: everything but the embedding table (rows gathered) and the
    MTP module (only speculative rounds run it)."""
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    return sum(t.numel() * t.element_size() for n, t in tensors if not n.startswith(("embed.", "rotary.", "mtp.")))


def run(engine, prompts, max_tokens):
    """Submit all prompts at once; -> list of finish events."""
    from engine.api import SamplingParams
    handles = [engine.submit(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
               for p in prompts]
    return [[ev for ev in h][-1] for h in handles]


def bench_engine(model, args, profile: str, context: int, speculative_tokens: int | None = None):
    """An engine over `model` as the app loads it (speculative_tokens None: the default, MTP drafts on a GPU when the
    model has its MTP module; 0: off)."""
    from engine.api import Engine, EngineConfig
    return Engine.from_model(EngineConfig(model="", device="cuda", profile=profile, max_context=context,
                                          prefill_chunk=args.prefill_chunk, max_queue=16,
                                          speculative_tokens=speculative_tokens, kv_dtype=args.kv_dtype), model,
                              bench_tokenizer())


def prefill_figures(eng, n: int) -> dict:
    """TTFT of an n-token prompt, first use of its shapes (cold: kernels compile, tune) and again."""
    cold = run(eng, [rand_ids(n, n + 1)], 1)[0]
    fin = run(eng, [rand_ids(n, n)], 1)[0]
    return {f"prefill_{n}_tok_s": n / (fin.timings.ttft_ms / 1e3), f"ttft_{n}_ms": fin.timings.ttft_ms,
            f"ttft_{n}_cold_ms": cold.timings.ttft_ms}


def decode_figures(eng, model, profile: str, args, bw) -> dict:
    """C = the profile's concurrency streams of args.decode_tokens after args.decode_prompt-token prompts: per-stream
    and aggregate tok/s, and the roofline: the bytes a step reads over the copy bandwidth."""
    c = int(profile[1:])
    run(eng, [rand_ids(args.decode_prompt, 100 + i) for i in range(c)], 8)  # warm-up at this batch size
    fins = run(eng, [rand_ids(args.decode_prompt, 200 + i) for i in range(c)], args.decode_tokens)
    span = max(f.timings.total_ms for f in fins) - min(f.timings.ttft_ms for f in fins)
    return {f"decode_{profile}_per_stream_tok_s": sum(f.timings.decode_tok_s for f in fins) / c,
            f"decode_{profile}_aggregate_tok_s": c * (args.decode_tokens - 1) / (span / 1e3),
            f"decode_{profile}_roofline_tok_s": c / (decode_bytes(model, c, args) / bw)}


def profile_decode(eng, steps: int = 64) -> dict:
    """GPU time per decode step by kernel (CUPTI sees the kernels inside the CUDA graphs): a request of 1 token
    (prefill only) is profiled and subtracted from one of 1 + steps tokens. Prints the step's wall time, the sum of its
    kernels (the difference is gaps between kernels and host time: launches) and the top kernels with their launches
    per step; returns the first three."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    per_kernel = []
    walls = []
    for n in (1, 1 + steps):
        totals: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            run(eng, [rand_ids(512, 30 + n)], n)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        for k in prof.key_averages():
            totals[k.key][0] += k.self_device_time_total
            totals[k.key][1] += k.count
        per_kernel.append(totals)
    prefill, total = per_kernel                              # defaultdicts: a kernel only decode runs counts 0
    step = {name: ((us - prefill[name][0]) / steps, (count - prefill[name][1]) / steps)
            for name, (us, count) in total.items()}
    busy = sum(us for us, _ in step.values())
    launches = sum(c for _, c in step.values())
    wall = (walls[1] - walls[0]) / steps * 1e3
    print(f"decode step: wall {wall:.2f} ms, kernels {busy / 1e3:.2f} ms busy, {launches:.0f} launches")
    for name, (us, count) in sorted(step.items(), key=lambda kv: -kv[1][0])[:16]:
        print(f"  {us:8.1f} us  {count:6.1f}x  {name[:90]}")
    return {"step_wall_ms": wall, "step_busy_ms": busy / 1e3, "step_launches": launches}


def routed_expert_bytes(model, tokens: int) -> tuple[int, float]:
    """An MoE model's routed experts: (bytes held, bytes a step of `tokens` tokens reads): each layer reads the
    distinct experts its tokens chose, E (1 - (1 - k / E)^tokens) of them when routing is uniform (random weights).
    A shared expert stacked with them (expert E) is not one of them: every token reads it."""
    from engine.model.moe import SparseMoE
    held = sum(t.numel() * t.element_size() * m.num_experts // (m.num_experts + (m.shared_expert is None))
               for m in model.modules() if isinstance(m, SparseMoE)
               for lin in (m.gate_up, m.down) for t in [*lin.parameters(), *lin.buffers()])
    if not held:
        return 0, 0.0
    E, k = model.cfg.num_experts, model.cfg.num_experts_per_tok
    return held, held * (1 - (1 - k / E) ** tokens)


def step_bytes(model, c, args) -> tuple[float, float]:
    """(weight bytes, KV + GDN state bytes) a decode step of c sequences reads: the weights but the embedding table
    and the experts nobody chose; each sequence's KV at the mean context of the run, its GDN state read and written."""
    from engine.core.memory import kv_bytes_per_token, state_bytes_per_slot
    cfg = model.cfg
    ctx = args.decode_prompt + args.decode_tokens // 2
    held, read = routed_expert_bytes(model, c)
    return (weight_bytes(model) - held + read,
            c * ctx * kv_bytes_per_token(cfg, torch.bfloat16, False)
            + 2 * c * state_bytes_per_slot(cfg, torch.bfloat16))


def decode_bytes(model, c, args) -> float:
    return sum(step_bytes(model, c, args))
