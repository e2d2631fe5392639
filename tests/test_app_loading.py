"""Loading a model: the header names it, the status bar shows the engine's stage with a determinate bar,
Cancel stops the engine thread's load cleanly, Eject unloads; closing the window mid-load writes nothing."""

import threading
import time

import pytest
from PySide6.QtWidgets import QApplication

from app.load_state import Phase
from tests.app_support import make_context, open_window, screenshot, wait_ready


@pytest.fixture
def slow_weights(monkeypatch):
    """Each weight takes 30 ms to copy, so a tiny checkpoint loads for a few seconds (the real engine, slowed)."""
    from engine.weights import loader

    copy = loader._copy
    monkeypatch.setattr(loader, "_copy", lambda *args: (time.sleep(0.03), copy(*args)))


@pytest.fixture
def held_weights(monkeypatch):
    """The load stops before a weight once 3 KiB of them are in (the status shows a share) and waits there until the
    test sets the event it yields: a load the test cancels cannot have finished meanwhile, however slow the machine.
    (Slowed by sleeps alone, the load ended ~1.9 s after the progress showed, and a busy CI machine's two screenshots
    before Cancel could take that long.)"""
    from engine.weights import loader

    copy, copied, go = loader._copy, [0], threading.Event()

    def held(target, row, shape, value):
        if copied[0] >> 10 >= 3:
            go.wait(timeout=60)
        copy(target, row, shape, value)
        copied[0] += value.numel()
    monkeypatch.setattr(loader, "_copy", held)
    yield go
    go.set()


def test_loading_shows_progress_and_cancel_stops_it(app_env, qtbot, checkpoint, held_weights):
    path = str(checkpoint("base"))
    window = open_window(qtbot, make_context(app_env), autoload=False)
    states = []
    window.engine.state_changed.connect(lambda state: states.append(state.phase))
    window.load_model(path)
    assert window.chat.model_badge.text().startswith("Loading base")
    load = window.engine.state.progress
    qtbot.waitUntil(lambda: load.fraction is not None and load.done >= 3, timeout=20_000)
    status = window.status
    assert status.progress.maximum() == 1000 and status.progress.value() > 0      # determinate
    assert "Loading base" in status.text.text() and f"of {load.total}" in status.text.text()
    assert status.cancel.isVisible() and "%" in window.chat.model_badge.text()
    window.show_page("chat")
    screenshot(window, "loading_progress")
    window.show_page("models")
    row = window.models.local_rows[0] if window.models.local_rows else None
    screenshot(window, "loading_models_page")
    status.cancel.click()
    held_weights.set()                                   # the load goes on to its next report, and stops there
    qtbot.waitUntil(lambda: window.engine.state.phase is Phase.UNLOADED, timeout=10_000)
    assert window.engine.model is None and "cancelled" in status.text.text()
    assert not status.cancel.isVisible() and window.chat.model_badge.text() == "No model loaded"
    assert states == [Phase.LOADING, Phase.UNLOADED]
    window.load_model(path)                              # the engine thread took the next load as usual
    wait_ready(qtbot, window)
    assert row is None or row.load.text() in ("Load", "Eject")


@pytest.fixture
def gated_loads(monkeypatch):
    """Load n (from 0) stops before its weights once 3 KiB are in, until the test sets gates[n]; `waiting` is set
    while one waits."""
    from app import engine_thread
    from engine.weights import loader

    copy, plan_for = loader._copy, engine_thread.plan_for
    gates, waiting, started, copied = [threading.Event() for _ in range(2)], threading.Event(), [-1], [0]

    def counted_plan(config):
        started[0], copied[0] = started[0] + 1, 0
        return plan_for(config)

    def held(target, row, shape, value):
        if copied[0] >> 10 >= 3 and not gates[started[0]].is_set():
            waiting.set()
            gates[started[0]].wait(timeout=60)
            waiting.clear()
        copy(target, row, shape, value)
        copied[0] += value.numel()
    monkeypatch.setattr(engine_thread, "plan_for", counted_plan)
    monkeypatch.setattr(loader, "_copy", held)
    yield gates, waiting
    for gate in gates:
        gate.set()


def test_a_load_that_gives_way_to_a_new_one_leaves_the_new_one_shown(app_env, qtbot, checkpoint, gated_loads):
    """The same checkpoint loaded again while it loads (settings applied mid-load): the first load's cancellation
    arrives after the second has started, and must not say that loading was cancelled (the window reconciled its
    own loading path with the engine thread's reports, and the first load's report cleared the second's)."""
    gates, waiting = gated_loads
    path = str(checkpoint("base"))
    window = open_window(qtbot, make_context(app_env, model_folders=[str(checkpoint("base").parent)]),
                         autoload=False)
    phases = []
    window.engine.state_changed.connect(lambda state: phases.append(state.phase))
    window.load_model(path)
    qtbot.waitUntil(waiting.is_set, timeout=20_000)
    window.load_model(path)
    waiting.clear()
    gates[0].set()                                       # the first load goes on to its next report: cancelled
    qtbot.waitUntil(waiting.is_set, timeout=20_000)      # the second one waits at its weights
    QApplication.processEvents()                         # every report sent before it waited has arrived
    status, chat = window.status, window.chat
    assert "cancelled" not in status.text.text() and status.cancel.isVisible()
    assert status.text.text().startswith("Loading base  ·  Loading weights  ·  ")         # the second load's count
    row = next(r for r in window.models.local_rows if r.model.path == path)
    assert chat.model_badge.text().startswith("Loading base") and row.load.text() == "Cancel"
    screenshot(window, "loading_again_while_loading")
    gates[1].set()
    wait_ready(qtbot, window)
    assert phases == [Phase.LOADING, Phase.LOADING, Phase.LOADED]


def test_eject_unloads_the_model(app_env, qtbot, checkpoint):
    path = str(checkpoint("base"))
    window = open_window(qtbot, make_context(app_env, model_folders=[str(checkpoint("base").parent)]),
                         autoload=False)
    window.load_model(path)
    wait_ready(qtbot, window)
    qtbot.waitUntil(lambda: window.chat.model_badge.text() == "base", timeout=5_000)
    row = next(r for r in window.models.local_rows if r.model.path == path)
    assert row.load.text() == "Eject"
    window.show_page("models")
    screenshot(window, "models_loaded_eject")
    row.load.click()
    qtbot.waitUntil(lambda: window.engine.model is None and window.session.backend is None, timeout=10_000)
    qtbot.waitUntil(lambda: row.load.text() == "Load", timeout=5_000)
    assert window.chat.model_badge.text() == "No model loaded" and window.status.text.text() == "No model loaded"


def test_closing_while_a_model_loads_writes_nothing_afterwards(app_env, qtbot, checkpoint, slow_weights):
    context = make_context(app_env, last_model=str(checkpoint("base")))
    window = open_window(qtbot, context)
    qtbot.waitUntil(lambda: window.engine.state.progress is not None and window.engine.state.progress.done >= 2,
                    timeout=20_000)
    started = time.monotonic()
    window.close()
    context.store.close()                                # what app.main does once the window has gone
    assert window.engine.wait(5_000) and time.monotonic() - started < 5     # the load was cancelled, not awaited
    qtbot.wait(200)                                      # anything the engine thread queued is delivered now


def test_a_stage_counted_by_size_shows_a_share_and_a_steady_time_left():
    from app.load_progress import LoadProgress

    load = LoadProgress("big", started=0.0)
    load.update("Converting weights to int4 (first load)", 0, 52_000_000, now=0.0)
    load.update("Converting weights to int4 (first load)", 13_000_000, 52_000_000, now=10.0)
    assert "25%" in load.text(now=10.0) and "13000000 of" not in load.text(now=10.0)
    assert load.eta_s(now=10.0) == pytest.approx(30.0, rel=0.01)
