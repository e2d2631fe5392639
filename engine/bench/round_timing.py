"""Where a speculative round's time goes, as the bench sees it from outside the engine: each round's span, launch
call and GPU time (timed_rounds), the garbage collector's full collections (full_collections), and the loop thread's
Python stack during slow rounds (loop_stacks, slow_stacks)."""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass

import torch


def quartiles(values: list[float]) -> list[float]:
    """min, quartiles, max."""
    v = sorted(values) or [0.0]
    return [round(v[round(q * (len(v) - 1))], 2) for q in (0, 0.25, 0.5, 0.75, 1)]


@dataclass
class TimedRound:
    """One round as timed_rounds saw it (perf_counter seconds; GPU figures in ms, None off a GPU)."""
    start: float                # its launch, or the read of the round before if that came later
    end: float                  # the read of its tokens: start .. end is what a stream waits for it
    launch_ms: float            # the host's launch call (pages, snapshots, inputs built and uploaded, the replay)
    beside_prefill: bool        # a prefill chunk ran inside start .. end (the round's span holds it)
    gpu_ms: float | None = None     # the round's own GPU time (uploads, graph, the copies of its tokens)
    idle_ms: float | None = None    # GPU time between the end of the work queued before it and its start: idle,
    #                                 unless a prefill chunk ran there


@contextlib.contextmanager
def timed_rounds(eng):
    """Each round the engine reads while the block runs, as TimedRound, in order. A round is launched before the one
    in flight is read, where it can be (engine/spec/speculation.py): a span then starts at that read."""
    spec, loop, rounds = eng._spec, eng._loop, []
    launch, finish, prefill = spec.launch, spec.finish, loop._prefill
    on_gpu = torch.cuda.is_available()
    launched: dict[int, tuple] = {}
    prefills: list[tuple[float, float]] = []
    last_read = [0.0]

    def event():
        if not on_gpu:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def launch_(seqs, k, after=None):
        e0, t0 = event(), time.perf_counter()
        flight = launch(seqs, k, after)
        launched[id(flight)] = (t0, time.perf_counter(), e0, event())
        return flight

    def finish_(flight):
        new = finish(flight)
        t2 = time.perf_counter()
        t0, t1, e0, e1 = launched.pop(id(flight))
        start = max(t0, last_read[0])
        last_read[0] = t2
        rounds.append((TimedRound(start, t2, 1e3 * (t1 - t0), any(p0 < t2 and start < p1 for p0, p1 in prefills)),
                       e0, e1))
        return new

    def prefill_():
        t0 = time.perf_counter()
        ran = prefill()
        if ran:
            prefills.append((t0, time.perf_counter()))
        return ran
    spec.launch, spec.finish, loop._prefill = launch_, finish_, prefill_
    timed: list[TimedRound] = []
    try:
        yield timed
    finally:
        del spec.launch, spec.finish, loop._prefill
        if on_gpu:
            torch.cuda.synchronize()
            for i, (r, e0, e1) in enumerate(rounds):
                r.gpu_ms = e0.elapsed_time(e1)
                if i:
                    r.idle_ms = rounds[i - 1][2].elapsed_time(e0)
        timed.extend(r for r, _, _ in rounds)


def round_gpu_times(rounds: list[TimedRound]) -> dict:
    """Medians (ms) of timed rounds: launch_ms, the host's launch call; gpu_ms, the round's own GPU time; idle_ms, the
    GPU's wait before it (what launching a round before reading the one in flight hides)."""
    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else 0.0
    return dict(launch_ms=median(r.launch_ms for r in rounds), gpu_ms=median(r.gpu_ms for r in rounds),
                idle_ms=median(r.idle_ms for r in rounds))


@contextlib.contextmanager
def full_collections():
    """The spans (perf_counter start and end) of the garbage collector's full collections while the block runs, in
    any thread: each one holds the interpreter, the engine's loop included (engine/core/collector.py)."""
    spans: list[tuple[float, float]] = []
    started = [0.0]

    def note(phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                spans.append((started[0], time.perf_counter()))
    gc.callbacks.append(note)
    try:
        yield spans
    finally:
        gc.callbacks.remove(note)


@contextlib.contextmanager
def loop_stacks(eng, on: bool = True, period: float = 0.002):
    """Samples (perf_counter, where) of the engine loop thread's Python stack every `period` seconds while the block
    runs (nothing when not on): where the host was during a slow round. `where` is the innermost frames."""
    samples: list[tuple[float, str]] = []
    if not on:
        yield samples
        return
    ident, done = eng._loop._thread.ident, threading.Event()

    def sample():
        while not done.wait(period):
            frame = sys._current_frames().get(ident)
            if frame is not None:
                samples.append((time.perf_counter(), _where(frame)))
    sampler = threading.Thread(target=sample, name="bench-stacks", daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        done.set()
        sampler.join()


def _where(frame, depth: int = 5) -> str:
    parts: list[str] = []
    while frame is not None and len(parts) < depth:
        parts.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


def slow_stacks(spans: list[tuple[float, float]], samples: list[tuple[float, str]]) -> list[str]:
    """For each span (a slow round), its length and the stack the loop was seen in most often inside it."""
    lines = []
    for t0, t1 in spans:
        inside = collections.Counter(where for t, where in samples if t0 <= t <= t1)
        if inside:
            where, n = inside.most_common(1)[0]
            lines.append(f"{1e3 * (t1 - t0):.1f} ms: {n} of {sum(inside.values())} samples in {where}")
    return lines
