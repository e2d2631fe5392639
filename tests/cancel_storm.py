"""Random requests with a share cancelled at random moments, for the tests that check an engine gives every page and
slot back (tests/test_speculation.py, tests/test_block_drafter.py)."""

from __future__ import annotations

import random
import time

import torch

from engine.api import SamplingParams


def cancel_storm(engine, requests: int, cancels: int) -> dict:
    """Submit `requests` greedy requests (1-60 prompt tokens, 1-12 new), cancel `cancels` of them at random moments,
    read every stream to its end (each ends by length or cancel), wait for the engine to run nothing, and return its
    stats."""
    rng = random.Random(0)
    handles = []
    for i in range(requests):
        ids = torch.randint(0, 600, (rng.randint(1, 60),), generator=torch.Generator().manual_seed(i)).tolist()
        handles.append(engine.submit(ids, SamplingParams(max_tokens=rng.randint(1, 12), temperature=0.0,
                                                         ignore_eos=True)))
    for h in rng.sample(handles, cancels):
        time.sleep(rng.random() * 0.002)
        h.cancel()
    finals = [[ev for ev in h][-1] for h in handles]
    assert {f.finish_reason for f in finals} <= {"length", "cancelled"}
    deadline = time.time() + 5
    while engine.stats()["running"] and time.time() < deadline:
        time.sleep(0.01)
    return engine.stats()
