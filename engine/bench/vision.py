"""`python -m engine.bench.vision`: images at 27B shapes with random weights (GPU).

TTFT of one 1024 x 1024 image + a 100-token question through the engine (image read and resized, tower, prefill,
first token), the tower's encode alone, its throughput in images/s at 1024², the peak memory of encoding the largest
image (max_pixels) against the planner's estimate, and the 24 GiB vision plan (int4, tower on demand, C1).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.bench.random_model import PREPROCESSOR, bench_tokenizer, build_random_model, build_random_tower, rand_ids, \
    wrapper_config

GIB = 1 << 30


def png(side: int, seed: int = 0) -> bytes:
    out = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def synced(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench_vision")
    ap.add_argument("--side", type=int, default=1024)
    ap.add_argument("--question", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from engine.api import DeviceInfo, Engine, EngineConfig, SamplingParams, parse_model_config, plan_for
    from engine.core.memory import vision_encode_bytes
    from engine.vision.encoder import ImageEncoder
    from engine.vision.processor import parse_processor_config, process_image

    raw = wrapper_config("27b")
    cfg = parse_model_config(raw)
    out: dict[str, Any] = {}
    # the 24 GiB plan (no weights needed)
    card = DeviceInfo("cuda", "24 GiB card", 24 * GIB, int(23.5 * GIB))
    plan = plan_for(EngineConfig(model="", profile="C1"), card, model=cfg)
    out["plan_24gib"] = dict(weights=plan.weights, vision=plan.vision, max_context=plan.max_context,
                             vision_gib=plan.vision_bytes / GIB, summary=plan.summary())
    print("24 GiB plan:", plan.summary(), flush=True)

    model = build_random_model(raw, "bf16")            # the wrapper's config: the engine reads its vision part
    tower = build_random_tower(cfg.vision, "bf16", "resident")
    proc = parse_processor_config(PREPROCESSOR)
    eng = Engine.from_model(EngineConfig(model="", device="cuda", profile="C1", max_context=8192), model,
                            bench_tokenizer(), vision=(tower, proc, "resident"))
    encoder = eng._encoder
    assert encoder is not None                  # built with its tower
    data = png(args.side)
    image = process_image(data, proc)
    with torch.inference_mode():
        for _ in range(2):
            encoder.encode(image)                                 # warm up
        times = [synced(lambda: encoder.encode(image))[1] for _ in range(args.repeats)]
        batch = [process_image(png(args.side, s), proc) for s in range(8)]
        _, seconds = synced(lambda: [encoder.encode(i) for i in batch])
    out["tower_ms"] = 1e3 * min(times)
    out["tower_images_per_s"] = len(batch) / seconds
    print(f"tower {args.side}²: {out['tower_ms']:.1f} ms ({image.num_tokens} tokens); "
          f"{out['tower_images_per_s']:.1f} images/s", flush=True)

    def ttft(seed: int) -> float:
        question, data = rand_ids(args.question, seed), png(args.side, 100 + seed)   # the file as a client sends it
        started = time.perf_counter()
        images = eng.process_images([data])
        ids = eng.expand_images([cfg.image_token_id] + question, images)
        handle = eng.submit(ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), images=images)
        for _ in handle:
            pass
        return time.perf_counter() - started

    ttft(0)
    ttft(1)
    out["ttft_ms"] = 1e3 * min(ttft(2 + i) for i in range(args.repeats))
    started = time.perf_counter()
    eng.process_images([data])
    out["read_resize_ms"] = 1e3 * (time.perf_counter() - started)
    print(f"TTFT image {args.side}² + {args.question}-token question: {out['ttft_ms']:.1f} ms "
          f"(of which PNG read + resize {out['read_resize_ms']:.1f} ms, tower {out['tower_ms']:.1f} ms)", flush=True)
    eng.close()

    # the largest image: the planner's estimate against the measured peak
    side = int(proc.max_pixels ** 0.5)
    big = process_image(png(side), proc)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        _, seconds = synced(lambda: ImageEncoder(tower, torch.device("cuda"), "resident").encode(big))  # as the engine
    peak = torch.cuda.max_memory_allocated() - base
    out["max_image"] = dict(side=side, tokens=big.num_tokens, encode_ms=1e3 * seconds, peak_gib=peak / GIB,
                            planned_gib=vision_encode_bytes(cfg, torch.bfloat16, proc.max_pixels) / GIB)
    print(f"largest image {side}² ({big.num_tokens} tokens): encode {1e3 * seconds:.0f} ms, peak "
          f"{peak / GIB:.2f} GiB, planned {out['max_image']['planned_gib']:.2f} GiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
