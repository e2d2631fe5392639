"""Python's cyclic garbage collector and a loaded engine.

A full collection walks every object the collector tracks, and it runs in whichever thread happens to allocate,
holding the interpreter: the engine's loop thread included, so every stream waits. With torch, Triton and a loaded
model there are a few hundred thousand such objects: 143 ms a walk on a CPU core (on an H100 the benchmark's rows
with the freeze ran no full collection at all; the slow C8 rounds once suspected of it stayed, so they have another
cause: docs/performance.md 2026-12-07, seventh session). What a load builds lives as long as
the engine, so it is moved out of the collector's sight (gc.freeze) once it exists: later full collections walk only
what came after, well under a millisecond.
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """Collect everything once, then keep what survives out of later collections. The objects an earlier freeze
    kept (an engine since closed) become collectable first. Call it where a pause is expected (after a load), from a
    thread that may run any object's finalizer (the desktop app: its GUI thread, app/gc_guard.py)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def release_frozen() -> None:
    """After an engine closes: what a freeze kept becomes collectable again, and is collected now (cycles holding
    device memory among them)."""
    gc.unfreeze()
    gc.collect()
