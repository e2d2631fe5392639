"""The 24 GB card, simulated on a bigger GPU: `qwendesk-bench --simulate-gb 24`.

The process is capped with torch.cuda.set_per_process_memory_fraction (an allocation past the
cap fails as it would on the small card) and the engine plans with the same cap. The model is loaded as the
app loads it: the weights the planner picks for the card (int4 for the 27B on 24 GiB), the MTP module with the
speculation buffers (3 drafts, the default on a GPU), no vision tower (it loads only when used). Three scenarios
must load and decode: C1 with 32K tokens of bf16 KV, C1 with int8 KV at the largest context the plan allows
(>= 170K wanted), and C8 with 8K tokens each. For each, the plan's prediction is printed beside the measured peak.
"""

from __future__ import annotations

import torch

GIB = 1 << 30

SCENARIOS = [
    # name, EngineConfig fields, prompt tokens per request, requests
    ("C1, bf16 KV, 32K context", dict(profile="C1", max_context=32768), 30000, 1),
    ("C1, int8 KV, largest context", dict(profile="C1", kv_dtype="int8"), 4096, 1),
    ("C8, bf16 KV, 8K context each", dict(profile="C8", max_context=8192), 2048, 8),
]


def simulate(raw: dict, gb: float) -> dict:
    from engine.api import Engine, EngineConfig, SamplingParams, parse_model_config, plan_for
    from engine.random_model import bench_tokenizer, build_random_model, rand_ids

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(gb * GIB / total)
    weights = plan_for(EngineConfig(model="", gpu_memory_gb=gb), model=parse_model_config(raw)).weights
    model = build_random_model(raw, weights, check=False, mtp=True)   # the speed bench checks the kernels
    held = torch.cuda.memory_allocated()
    print(f"simulated card: {gb:.0f} GiB; {weights} weights hold {held / GIB:.2f} GiB", flush=True)
    tok = bench_tokenizer()
    rows = []
    for name, fields, prompt_len, requests in SCENARIOS:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        row = {"scenario": name}
        try:
            eng = Engine.from_model(EngineConfig(model="", device="cuda", gpu_memory_gb=gb, **fields), model, tok)
            plan = eng.plan()
            handles = [eng.submit(rand_ids(prompt_len, i), SamplingParams(max_tokens=16, temperature=0.0,
                                                                          ignore_eos=True))
                       for i in range(requests)]
            finals = [[ev for ev in h][-1] for h in handles]
            eng.close()
            predicted = held + plan.kv_bytes + plan.state_bytes + plan.workspace_bytes
            peak = torch.cuda.max_memory_allocated()
            row.update(ok=all(f.usage.completion_tokens == 16 for f in finals), max_context=plan.max_context,
                       predicted_gib=predicted / GIB, peak_gib=peak / GIB, under_predicted=peak > predicted,
                       decode_tok_s=sum(f.timings.decode_tok_s for f in finals))
        except Exception as e:   # a refusal or an OOM is a result here
            row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        rows.append(row)
        print(row, flush=True)
    print(f"\n{'scenario':32s} {'ok':>4s} {'context':>8s} {'predicted':>10s} {'peak':>8s}")
    for r in rows:
        print(f"{r['scenario']:32s} {str(r['ok']):>4s} {r.get('max_context', 0):8d} "
              f"{r.get('predicted_gib', 0):9.2f}G {r.get('peak_gib', 0):7.2f}G {r.get('error', '')}")
    return {"gb": gb, "weights": weights, "held_gib": held / GIB, "scenarios": rows}
