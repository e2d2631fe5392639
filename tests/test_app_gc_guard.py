"""app/gc_guard.py: no automatic collection (it could run on the engine thread), and no full
collection of long-lived objects on the GUI thread's timer (it froze the window ~150 ms a second)."""

import gc
import time

from PySide6.QtCore import QObject

from app import gc_guard


def test_the_timer_collects_young_generations_and_rarely_all(qapp, qtbot, monkeypatch):
    calls = []
    monkeypatch.setattr(gc_guard.gc, "collect", lambda generation=2: calls.append(generation) or 0)
    monkeypatch.setattr(gc_guard, "FULL_EVERY", 5)
    owner = QObject()
    timer = gc_guard.collect_in_gui_thread(owner, interval_ms=5)
    collector = timer.parent()
    try:
        assert not gc.isenabled() and calls == [2]     # freezing what exists at start: one full collection
        qtbot.waitUntil(lambda: collector.ticks >= 1, timeout=5_000)    # the timer drives the collector
        timer.stop()       # from here its ticks alone: another window's timer (an earlier test's) collects too
        collector.ticks, calls[:] = 0, []
        for _ in range(10):
            collector.tick()
        assert calls == [1, 1, 1, 1, 2] * 2
    finally:
        owner.deleteLater()
        qtbot.waitUntil(gc.isenabled, timeout=5_000)


def test_a_tick_is_short_with_many_long_lived_objects(qapp, qtbot):
    ballast = [{"i": i} for i in range(220_000)]          # a loaded model's count of tracked objects
    owner = QObject()
    collector = gc_guard.collect_in_gui_thread(owner, interval_ms=60_000).parent()
    try:
        gc_guard.freeze_long_lived()                       # what the window does after a load
        pauses = []
        for _ in range(gc_guard.FULL_EVERY):               # the young ticks and the full one
            started = time.perf_counter()
            collector.tick()
            pauses.append(time.perf_counter() - started)
        assert max(pauses) < 0.03, pauses
    finally:
        del ballast
        owner.deleteLater()
        qtbot.waitUntil(gc.isenabled, timeout=5_000)
