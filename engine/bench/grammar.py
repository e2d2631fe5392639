"""`qwendesk-bench --json-schema FILE --tokenizer DIR`: decode speed with a JSON-schema constraint against without, at
real shapes with random weights, and the host's mask cost per step (engine/text/grammar.py Grammars.masks, timed).

The tokenizer must be a real byte-level one (the grammar spells JSON with its tokens): a checkpoint folder's
tokenizer.json, e.g. the Qwen3.5 vocabulary the tests build (tests/fixtures/tokenizer.py kind="qwen"). Greedy
decoding of a random model under the schema; a request the grammar ends early counts the tokens it made."""

from __future__ import annotations

import json
import time

from engine.bench.random_model import rand_ids


def bench_grammar(model, args) -> dict:
    from engine.api import Constraint, Engine, EngineConfig, SamplingParams
    from engine.text.tokenizer import Tokenizer
    tok = Tokenizer.from_checkpoint(args.tokenizer)
    with open(args.json_schema, encoding="utf-8") as f:
        schema = json.load(f)
    res = {}
    for profile in args.profiles:
        c = int(profile[1:])
        eng = Engine.from_model(EngineConfig(model="", device=next(model.parameters()).device.type, profile=profile,
                                             max_queue=16,
                                             max_context=args.decode_prompt + args.decode_tokens + 64), model, tok)
        spent = []
        masks = eng._grammars.masks

        def timed(matchers):
            t = time.perf_counter()
            out = masks(matchers)
            spent.append(time.perf_counter() - t)
            return out
        eng._grammars.masks = timed  # type: ignore[method-assign]  # timed in place for this benchmark
        for mode in ("plain", "json", "plain", "json"):        # each twice: the first of each warms up
            constraint = Constraint(json_schema=schema) if mode == "json" else None
            spent.clear()
            params = [SamplingParams(max_tokens=args.decode_tokens, temperature=0.0, ignore_eos=True,
                                     constraint=constraint) for _ in range(c)]
            stamps: list[list[float]] = [[] for _ in params]   # per sequence: the time of each token event

            def stamp(ev, i):
                if ev.token_ids:
                    stamps[i].append(time.perf_counter())
            handles = [eng.submit(rand_ids(args.decode_prompt, 300 + i), p, on_event=lambda ev, i=i: stamp(ev, i))
                       for i, p in enumerate(params)]
            fins = [[ev for ev in h][-1] for h in handles]
            span = max(f.timings.total_ms for f in fins) - min(f.timings.ttft_ms for f in fins)
            tokens = sum(f.usage.completion_tokens - 1 for f in fins)
            res[f"decode_{profile}_{mode}_tok_s"] = tokens / (span / 1e3)
            res[f"decode_{profile}_{mode}_tokens"] = tokens
            # time per step while every sequence decodes: from the last first token (all prefills done) to the
            # first last token (a schema may end replies early, after which the batch shrinks)
            t0, t1 = max(t[0] for t in stamps), min(t[-1] for t in stamps)
            steps = sum(t0 < x <= t1 for x in stamps[0])
            res[f"decode_{profile}_{mode}_step_ms"] = 1e3 * (t1 - t0) / max(steps, 1)
            if mode == "json":
                res[f"mask_{profile}_ms_per_step"] = 1e3 * sum(spent) / max(len(spent), 1)
                res[f"mask_{profile}_ms_max"] = 1e3 * max(spent, default=0.0)
        eng.close()
        res[f"decode_{profile}_json_vs_plain"] = (res[f"decode_{profile}_plain_step_ms"]
                                                  / res[f"decode_{profile}_json_step_ms"])   # per decode step
    return res


def report(r: dict) -> None:
    for key, val in r.items():
        print(f"{key:40s} {val:10.3f}" if isinstance(val, float) else f"{key:40s} {val}")


def mask_cost(tokenizer_dir: str, schema_file: str, vocab: int = 248320, steps: int = 256, walks: int = 8) -> dict:
    """The host's cost of the grammar alone (no model): compile the schema, then random walks through it, each
    token drawn uniformly from the mask; times per step of Grammars.masks and of feeding the token."""
    import random

    import torch

    from engine.api import Constraint
    from engine.text.grammar import Grammars
    from engine.text.tokenizer import Tokenizer
    with open(schema_file, encoding="utf-8") as f:
        schema = json.load(f)
    grammars = Grammars(Tokenizer.from_checkpoint(tokenizer_dir), vocab)
    t = time.perf_counter()
    grammars.matcher(Constraint(json_schema={"type": "object"}), in_reasoning=False)
    setup = time.perf_counter() - t
    compiles, masks, feeds, rng = [], [], [], random.Random(0)
    for _ in range(walks):
        t = time.perf_counter()
        m = grammars.matcher(Constraint(json_schema=schema), in_reasoning=False)
        compiles.append(time.perf_counter() - t)
        for _ in range(steps):
            t = time.perf_counter()
            mask = grammars.masks([m])
            assert mask is not None                 # a constrained matcher has one
            masks.append(time.perf_counter() - t)
            bits = ((mask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
            token = rng.choice(torch.nonzero(bits).flatten().tolist())
            t = time.perf_counter()
            m.advance(token, "content")
            feeds.append(time.perf_counter() - t)
            if m.done:
                break
    ms = sorted(1e3 * x for x in masks)
    return {"tokenizer_setup_s": setup, "compile_ms_mean": 1e3 * sum(compiles) / len(compiles),
            "mask_ms_mean": sum(ms) / len(ms), "mask_ms_p50": ms[len(ms) // 2], "mask_ms_p99": ms[int(.99 * len(ms))],
            "mask_ms_max": ms[-1], "feed_ms_mean": 1e3 * sum(feeds) / len(feeds), "steps": len(ms)}


if __name__ == "__main__":       # python -m engine.bench.grammar TOKENIZER_DIR SCHEMA_FILE: the host's cost alone
    import sys
    report(mask_cost(sys.argv[1], sys.argv[2]))
