"""Keep Python's cyclic garbage collector on the GUI thread, without freezing the GUI.

The collector runs in whichever thread happens to allocate. When that is the engine thread and
the cycle holds a Qt object that belongs to the GUI thread, Qt deletes it from the wrong thread
and the process crashes. So while a window lives, automatic collection is off and the GUI thread
collects on a timer instead.

A full collection walks every tracked object: with a model loaded that is a couple of hundred
thousand, ~150 ms of a frozen window. So the timer collects only the young generations (what was
allocated since the last tick: a few ms), and the long-lived objects (the imports, a loaded
model) are moved out of the collector's sight with gc.freeze() once they exist (the engine's
freeze_long_lived, called here on the GUI thread: the engine's own, at the end of a load, is off in
the app); the rare full collection then walks only what came after.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

from engine.api import freeze_long_lived

FULL_EVERY = 60         # ticks between full collections (of the objects not frozen)

_windows = 0


class _Collector(QObject):
    def __init__(self, owner: QObject, interval_ms: int):
        super().__init__(owner)
        self.ticks = 0
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.tick)
        self.timer.start(interval_ms)

    def tick(self) -> None:
        self.ticks += 1
        gc.collect(2 if self.ticks % FULL_EVERY == 0 else 1)


def collect_in_gui_thread(owner: QObject, interval_ms: int = 1000) -> QTimer:
    """Switch automatic collection off until `owner` is destroyed; collect young objects every interval_ms."""
    global _windows
    _windows += 1
    gc.disable()
    freeze_long_lived()
    owner.destroyed.connect(_release)
    return _Collector(owner, interval_ms).timer


def _release(*_):
    global _windows
    _windows -= 1
    if _windows == 0:
        gc.unfreeze()
        gc.enable()
