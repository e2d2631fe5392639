"""Keep Python's cyclic garbage collector on the GUI thread.

The collector runs in whichever thread happens to allocate. When that is the engine thread and
the cycle holds a Qt object that belongs to the GUI thread, Qt deletes it from the wrong thread
and the process crashes. So while a window lives, automatic collection is off and the GUI thread
collects on a timer instead.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

_windows = 0


def collect_in_gui_thread(owner: QObject, interval_ms: int = 1000) -> QTimer:
    """Switch automatic collection off until `owner` is destroyed; collect every interval_ms."""
    global _windows
    _windows += 1
    gc.disable()
    timer = QTimer(owner)
    timer.timeout.connect(gc.collect)
    timer.start(interval_ms)
    owner.destroyed.connect(_release)
    return timer


def _release(*_):
    global _windows
    _windows -= 1
    if _windows == 0:
        gc.enable()
