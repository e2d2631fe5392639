"""Measure how long the GUI's event loop stalls while a reply streams from a tiny model.

    PYTHONPATH=. QT_QPA_PLATFORM=offscreen python tests/event_loop_gaps.py [--seconds 20] [--ballast 220000] [--old]

A 2 ms timer on the GUI thread records the time between its ticks; a gap is that time less 2 ms.
`--ballast N` keeps N long-lived objects alive (a real checkpoint's module tree, parameters and
tokenizer are ~220K tracked objects; the tiny model has few), `--old` collects everything each
second as app/gc_guard.py used to. Prints p50 / p99 / max of the gaps.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--ballast", type=int, default=220_000)
    ap.add_argument("--old", action="store_true", help="a full collection every second (the old guard)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qwendesk-gaps-"))
    os.environ["QWENDESK_DATA_DIR"] = str(tmp / "data")
    os.environ.setdefault("QWENDESK_CACHE_DIR", str(tmp / "cache"))
    from PySide6.QtCore import QElapsedTimer, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from app import gc_guard
    from app.theme import apply_theme
    from tests.app_support import make_context
    from tests.fixtures.checkpoints import write_checkpoint

    app = QApplication([])
    apply_theme(app)
    ballast = [{"i": i, "self": None} for i in range(args.ballast)]     # dicts: tracked by the collector
    if args.old:
        gc_guard.FULL_EVERY = 1
        gc_guard.freeze_long_lived = lambda: None
    from app.window import MainWindow

    model = write_checkpoint(tmp / "base", "base")
    window = MainWindow(make_context(tmp, last_model=str(model), max_tokens=400, thinking=False))
    window.show()
    deadline = time.monotonic() + 120
    while window.engine.model is None and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    assert window.engine.model is not None, "the tiny model did not load"

    clock, gaps, last = QElapsedTimer(), [], [0]
    clock.start()

    def tick():
        now = clock.nsecsElapsed()
        if last[0]:
            gaps.append(max(0.0, (now - last[0]) / 1e6 - 2.0))
        last[0] = now

    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.timeout.connect(tick)
    timer.start(2)
    composer = window.chat.composer
    started, replies = time.monotonic(), 0
    while time.monotonic() - started < args.seconds:
        if not window.session.busy:
            composer.input.setPlainText(f"Tell me a long story, part {replies}")
            composer.input.submit.emit()
            replies += 1
        app.processEvents()
        time.sleep(0.0005)
    timer.stop()
    window.session.stop()
    window.close()
    gaps.sort()

    def q(p):
        return gaps[min(len(gaps) - 1, int(p * len(gaps)))]
    print(f"guard={'old (full gc each second)' if args.old else 'new'} ballast={args.ballast} "
          f"replies={replies} ticks={len(gaps)} gap ms: p50={statistics.median(gaps):.2f} p99={q(0.99):.2f} "
          f"p999={q(0.999):.2f} max={gaps[-1]:.2f}  tracked objects={len(gc.get_objects())}")
    del ballast


if __name__ == "__main__":
    main()
