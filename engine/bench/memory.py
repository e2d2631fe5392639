"""The 24 GB card, simulated on a bigger GPU: `qwendesk-bench [--shape 35b-a3b] --simulate-gb 24`.

The process is capped with torch.cuda.set_per_process_memory_fraction (an allocation past the
cap fails as it would on the small card) and the engine plans with the same cap. The model is loaded as the
app loads a published checkpoint: the weights the planner picks for the card (int4 for the 27B and the 35B-A3B on
24 GiB), the MTP module with the speculation buffers (3 drafts, the default on a GPU), and the vision tower where
the plan puts it (on demand on 24 GiB: in page-locked host memory, on the GPU only while an image is encoded).
Each shape's scenarios must load and decode; the last sends the largest image the preprocessor keeps (16.7
megapixels, 16,384 tokens). With `--drafter random`, the MTP module then makes way for a random block drafter of
the published size (held as the plan holds it) and the drafter's scenarios run too (issue #45: >= 128K tokens of int8
KV beside it). For each, the plan's prediction for what the scenario uses (weights held + KV + state
+ the workspace of a prefill chunk, or of encoding the largest image where it sends one: the plan's workspace is the
larger of the two) is printed beside the measured peak: the peak must not exceed it, and should be within 3% under
it; the plan's whole total beside them.
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

import torch

GIB = 1 << 30


class Scenario(NamedTuple):
    name: str
    fields: dict          # EngineConfig fields
    prompt: int           # tokens of text per request
    requests: int
    image: bool = False   # each request also sends the largest image
    context: int = 0      # the context the scenario must plan (0: no demand)


DENSE = [
    Scenario("C1, bf16 KV, 32K context", dict(profile="C1", max_context=32768), 30000, 1),
    Scenario("C1, int8 KV, largest context", dict(profile="C1", kv_dtype="int8"), 4096, 1),
    # issue 49: the native 262,144 tokens (kv_dtype auto picks k4v4 on a 24 GiB card)
    Scenario("C1, auto KV, the native context", dict(profile="C1", kv_dtype="auto"), 4096, 1, context=262144),
    Scenario("C8, bf16 KV, 8K context each", dict(profile="C8", max_context=8192), 2048, 8),
    Scenario("C1, the largest image", dict(profile="C1"), 100, 1, image=True),
]
DRAFTER = [   # issue 45: the 27B with its block drafter, the tower on demand
    Scenario("C1, int8 KV, block drafter, 128K", dict(profile="C1", kv_dtype="int8"), 4096, 1, context=131072),
    Scenario("C4, int8 KV, block drafter, 8K each", dict(profile="C4", kv_dtype="int8", max_context=8192), 2048, 4),
]
MOE = [   # issue 30: C1 at >= 64K context and C8 at 8K each on a 24 GiB card, vision on demand
    Scenario("C1, bf16 KV, a 64K conversation", dict(profile="C1"), 65536 - 16, 1, context=65536),
    Scenario("C8, bf16 KV, 8K context each", dict(profile="C8", max_context=8192), 8192 - 32, 8),
    Scenario("C1, the largest image", dict(profile="C1"), 100, 1, image=True),
]


def largest_image(max_pixels: int) -> bytes:
    """A PNG of max_pixels (one colour: quick to write and read; the tower's cost does not depend on the pixels)."""
    from PIL import Image
    side = int(max_pixels ** 0.5)
    out = io.BytesIO()
    Image.new("RGB", (side, side), (91, 141, 239)).save(out, "PNG")
    return out.getvalue()


def simulate(shape: str, gb: float, drafter: bool = False) -> dict:
    from engine.api import Engine, EngineConfig, SamplingParams, parse_model_config, plan_for
    from engine.core.memory import workspace_bytes
    from engine.bench.random_model import (PREPROCESSOR, bench_tokenizer, build_random_drafter, build_random_model,
                                           build_random_tower, rand_ids, wrapper_config)
    from engine.vision.processor import parse_processor_config

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(gb * GIB / total)
    raw = wrapper_config(shape)
    cfg = parse_model_config(raw)
    planned = plan_for(EngineConfig(model="", gpu_memory_gb=gb), model=cfg)
    model = build_random_model(raw, planned.weights, check=False, mtp=True)   # the speed bench checks the kernels
    proc = parse_processor_config(PREPROCESSOR)
    vision = (build_random_tower(cfg.vision, planned.weights, planned.vision), proc, planned.vision)
    held = torch.cuda.memory_allocated()          # the weights, MTP's, and a resident tower's
    print(f"simulated card: {gb:.0f} GiB; {shape}, {planned.weights} weights + MTP hold {held / GIB:.2f} GiB; "
          f"vision tower {planned.vision}", flush=True)
    image = largest_image(proc.max_pixels)
    tok = bench_tokenizer()
    rows = []
    scenarios = MOE if cfg.is_moe else DENSE
    for i, sc in enumerate(scenarios + (DRAFTER if drafter else [])):
        if i == len(scenarios):                   # the MTP module makes way for the drafter
            model.mtp = None
            torch.cuda.empty_cache()
            model.attach_drafter(build_random_drafter(shape, planned.weights))
            held = torch.cuda.memory_allocated()
            print(f"block drafter instead of MTP: the weights hold {held / GIB:.2f} GiB", flush=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        row: dict[str, Any] = {"scenario": sc.name}
        try:
            eng = Engine.from_model(EngineConfig(model="", device="cuda", gpu_memory_gb=gb, **sc.fields), model, tok,
                                    vision=vision)
            plan = eng.plan()
            params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
            handles = []
            for i in range(sc.requests):
                ids = rand_ids(sc.prompt, i)
                if sc.image:
                    images = eng.process_images([image])
                    handles.append(eng.submit(eng.expand_images([cfg.image_token_id] + ids, images), params,
                                              images=images))
                else:
                    handles.append(eng.submit(ids, params))
            finals = [[ev for ev in h][-1] for h in handles]
            encoded = eng.stats()["images_encoded"]
            eng.close()
            text = workspace_bytes(cfg, torch.bfloat16, eng.config.prefill_chunk, eng.config.max_running)
            used = plan.workspace_bytes if sc.image else min(plan.workspace_bytes, text + plan.speculation_bytes)
            predicted = held + plan.kv_bytes + plan.state_bytes + used
            peak = torch.cuda.max_memory_allocated()
            row.update(ok=all(f.usage.completion_tokens == 16 for f in finals) and plan.max_context >= sc.context
                       and encoded == (sc.requests if sc.image else 0),
                       max_context=plan.max_context, prompt_tokens=finals[0].usage.prompt_tokens,
                       plan_gib=(held + plan.kv_bytes + plan.state_bytes + plan.workspace_bytes) / GIB,
                       predicted_gib=predicted / GIB, peak_gib=peak / GIB, under_predicted=peak > predicted,
                       gap=(predicted - peak) / predicted, decode_tok_s=sum(f.timings.decode_tok_s for f in finals))
        except Exception as e:   # a refusal or an OOM is a result here
            row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        rows.append(row)
        print(row, flush=True)
    print(f"\n{'scenario':34s} {'ok':>5s} {'context':>8s} {'prompt':>7s} {'plan':>8s} {'predicted':>10s} {'peak':>8s} "
          f"{'gap':>6s}  (goal: peak <= predicted, gap <= 3%)")
    for r in rows:
        gap = f"{100 * r['gap']:5.1f}%" if "gap" in r else ""
        print(f"{r['scenario']:34s} {str(r['ok']):>5s} {r.get('max_context', 0):8d} {r.get('prompt_tokens', 0):7d} "
              f"{r.get('plan_gib', 0):7.2f}G {r.get('predicted_gib', 0):9.2f}G {r.get('peak_gib', 0):7.2f}G {gap:>6s} "
              f"{r.get('error', '')}")
    return {"gb": gb, "shape": shape, "weights": planned.weights, "vision": planned.vision, "held_gib": held / GIB,
            "scenarios": rows}
