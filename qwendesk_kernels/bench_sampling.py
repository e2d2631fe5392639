"""Sampling and logprobs at V = 248320, batch 1 and 8.

Bytes: one read of the fp32 logits (plus the dense penalty state where used); the target is time:
<= 60 us for the batch-8 step with a mix of top-k / top-p / min-p rows. "graph" cases replay the step
from a CUDA graph, as the engine's decode loop will; the others are eager calls (Python launch overhead
included). Logits are randn * 3: a flat-ish distribution, close to the worst case for the number of
race records. Baseline: the torch references (full sort).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from qwendesk_kernels.bench import Case, graph_replay
from qwendesk_kernels.sampling import (Penalties, apply_penalties_ref, sample, sample_ref, token_logprobs,
                              top_logprobs_ref)

VOCAB = 248_320
ROWS = [(0.7, 20, 0.95, 0.0), (1.0, 0, 0.9, 0.0), (1.0, 50, 1.0, 0.05), (0.6, 0, 1.0, 0.1),
        (1.0, 0, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (1.2, 100, 0.8, 0.0), (1.0, 40, 0.95, 0.02)]


def _inputs(B: int):
    dev = "cuda"
    logits = torch.randn(B, VOCAB, device=dev) * 3
    rows = ROWS[:B]
    params = dict(temperature=torch.tensor([r[0] for r in rows], device=dev),
                  top_k=torch.tensor([r[1] for r in rows], device=dev),
                  top_p=torch.tensor([r[2] for r in rows], device=dev),
                  min_p=torch.tensor([r[3] for r in rows], device=dev),
                  seeds=torch.arange(B, device=dev) + 1234, steps=torch.full((B,), 7, device=dev))
    return logits, params


def _penalties(B: int) -> Penalties:
    dev = "cuda"
    counts = torch.zeros(B, VOCAB, dtype=torch.int32, device=dev)
    counts.scatter_(1, torch.randint(0, VOCAB, (B, 500), device=dev), 1)
    prompt = torch.zeros(B, VOCAB, dtype=torch.bool, device=dev)
    prompt.scatter_(1, torch.randint(0, VOCAB, (B, 4000), device=dev), True)
    full = torch.full((B,), 0.5, device=dev)
    return Penalties(counts, prompt, full, full * 0.4, full + 0.6)


def cases() -> list[Case]:
    out = []
    for B in (1, 8):
        logits, params = _inputs(B)
        target: dict[str, Any] = dict(target="<= 60 us", target_us=60.0) if B == 8 else {}
        step = partial(sample, logits, **params)
        ref = partial(sample_ref, logits, **params)
        out.append(Case("sampling", f"sample B={B} mixed, eager", step, bytes=B * VOCAB * 4, baseline=ref, **target))
        out.append(Case("sampling", f"sample B={B} mixed, graph", graph_replay(step), bytes=B * VOCAB * 4, baseline=ref,
                        **target))
        tokens = sample(logits, **params)
        out.append(Case("sampling", f"logprobs top-20 B={B}", partial(token_logprobs, logits, tokens, 20),
                        bytes=B * VOCAB * 4, baseline=partial(top_logprobs_ref, logits, 20)))
    logits, params = _inputs(8)
    pen = _penalties(8)
    pen_step = lambda: sample(logits, **params, penalties=pen)            # noqa: E731
    pen_ref = lambda: sample_ref(apply_penalties_ref(logits.clone(), pen.output_counts.float(), *pen[1:]), **params)  # noqa: E731
    out.append(Case("sampling", "sample B=8 mixed + penalties, graph", graph_replay(pen_step),
                    bytes=8 * VOCAB * (4 + 4 + 1), baseline=pen_ref, target="<= 60 us", target_us=60.0))
    return out
