"""The window as a whole: first run, load failures, single instance, closing, launching."""

import os
import subprocess
import sys
import time

from PySide6.QtCore import QCoreApplication

from app.catalog import load_catalog, recommend
from app.load_state import Phase
from app.settings import AppSettings
from engine.api import DeviceInfo, plan_for
from app.single_instance import SingleInstance, instance_key
from tests.app_support import (
    make_context,
    open_window,
    page_screenshot,
    screenshot,
    send,
    wait_ready,
)


GIB = 1 << 30
RTX3090 = DeviceInfo("cuda", "NVIDIA GeForce RTX 3090", 24 * GIB, int(23.5 * GIB))   # free: the desktop takes some


def card(gib: float) -> DeviceInfo:
    return DeviceInfo("cuda", f"a {gib:g} GiB GPU", int(gib * GIB), int((gib - 0.5) * GIB))


def test_first_run_opens_models_with_a_recommendation(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env, device=RTX3090))
    assert window.current_page == "models"
    assert "Qwen3.6 27B FP8" in window.models.recommendation.text()
    assert "runs as int4" in window.models.recommendation.text()
    assert window.models.cards[0].entry.id == "Qwen/Qwen3.6-27B-FP8"
    assert "Runs as int4" in window.models.cards[0].facts.text()          # the engine's decision, not the catalog's
    small = next(c for c in window.models.cards if c.entry.id == "Qwen/Qwen3.5-0.8B")
    assert "Runs as 16-bit" in small.facts.text()
    assert "Load a model" in window.chat.composer.status.text()
    screenshot(window, "first_run_models")
    page_screenshot(window.models, "models_full_first_run")
    window.show_page("chat")
    screenshot(window, "first_run_chat")
    window.show_page("settings")
    screenshot(window, "first_run_settings")


def test_recommendation_follows_gpu_memory():
    catalog, config = load_catalog(), AppSettings()

    def recommended(device):
        plans = {e.id: plan_for(config.engine_config(e.id), device, model=e.architecture) for e in catalog}
        return recommend(catalog, plans, device).id

    assert recommended(RTX3090) == "Qwen/Qwen3.6-27B-FP8"
    assert recommended(card(16)) == "Qwen/Qwen3.5-9B"
    assert recommended(card(6)) == "Qwen/Qwen3.5-4B"
    assert recommended(DeviceInfo("cpu", "CPU", 32 * GIB, 16 * GIB)) == "Qwen/Qwen3.5-0.8B"


def test_catalog_entries_are_confirmed_qwen_checkpoints():
    for entry in load_catalog():
        assert entry.id.startswith("Qwen/Qwen3.") and entry.source and entry.download_gb > 0
        assert entry.architecture.model_type in ("qwen3_5_text", "qwen3_5_moe_text") and entry.params in entry.id
        assert entry.architecture.is_moe == ("-A3B" in entry.params)


def test_a_model_that_cannot_load_is_a_message(app_env, qtbot, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "llama"}')
    window = open_window(qtbot, make_context(app_env, last_model=str(tmp_path / "broken")))
    qtbot.waitUntil(lambda: window.engine.state.phase is Phase.FAILED, timeout=20_000)
    qtbot.waitUntil(lambda: "could not be loaded" in window.chat.banner.latest().text.text(), timeout=5_000)
    assert window.chat.banner.isVisible() and window.chat.banner.latest().property("kind") == "error"
    assert window.status.dot.property("state") == "error"
    assert window.chat.composer._blocked_reason
    screenshot(window, "chat_load_failed")


def test_single_instance_hands_over_to_the_first(app_env, qtbot):
    key = instance_key(str(app_env))
    first = SingleInstance(key)
    assert first.listen()
    second = SingleInstance(key)
    try:
        with qtbot.waitSignal(first.activated, timeout=5_000):
            assert second.notify_running()
        assert not SingleInstance(instance_key(str(app_env / "other"))).notify_running()
    finally:
        first.close()


def test_closing_while_a_reply_streams_does_not_hang(app_env, qtbot, checkpoint):
    window = open_window(qtbot, make_context(app_env, last_model=str(checkpoint("base")), max_tokens=3000,
                                             thinking=False))
    wait_ready(qtbot, window)
    send(qtbot, window, "A long answer, please")
    qtbot.waitUntil(lambda: window.session.busy, timeout=10_000)
    started = time.monotonic()
    window.close()
    assert time.monotonic() - started < 10
    assert window.engine.isFinished()
    QCoreApplication.processEvents()


def test_python_m_app_starts_and_shows_the_window(tmp_path):
    """`python -m app` opens the window; a second launch hands over to it and exits."""
    env = {**os.environ, "QWENDESK_DATA_DIR": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    first = subprocess.Popen([sys.executable, "-m", "app"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "qwendesk.sqlite3").exists() and time.monotonic() < deadline:
            assert first.poll() is None, first.stdout.read().decode()
            time.sleep(0.2)
        time.sleep(1.0)
        assert first.poll() is None
        second = subprocess.run([sys.executable, "-m", "app"], env=env, capture_output=True, timeout=60, check=False,
                                text=True)
        assert second.returncode == 0
        assert "already running: its window was brought to the front" in second.stdout      # it said nothing
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(timeout=20)


def test_the_catalog_puts_what_fits_first_and_asks_before_a_too_large_download(app_env, qtbot, monkeypatch):
    cpu = DeviceInfo("cpu", "CPU", 32 * GIB, 16 * GIB)
    window = open_window(qtbot, make_context(app_env, device=cpu), autoload=False)
    page = window.models
    fits = [not c.too_large for c in page.cards]
    assert page.cards[0].entry is page.recommended and fits == sorted(fits, reverse=True) and fits.count(False) >= 6
    big = page.cards[-1]
    assert big.fit_badge.isVisible() and big.fit_badge.text() == "Too large for this computer"
    facts = big.facts.text()
    assert "available: the weights alone take" in facts and "Needs" in facts and "Too large" not in facts
    assert "of weights" in page.cards[0].facts.text()
    asked = []
    monkeypatch.setattr("app.dialogs.confirm", lambda *args, **kw: asked.append(args[2]) or False)
    monkeypatch.setattr(window.downloads, "start", lambda repo_id: asked.append(("started", repo_id)))
    big.button.click()
    assert len(asked) == 1 and "will not run here" in asked[0]                 # asked, and said no: nothing started
    page.cards[0].button.click()
    assert asked[-1] == ("started", page.cards[0].entry.id)                    # one that fits: no question
    page_screenshot(page, "models_catalog_by_fit")
    page.fits_only.setChecked(True)
    assert [c.isVisible() for c in page.cards] == fits
    assert page.hidden_note.isVisible() and f"{fits.count(False)} larger models hidden" in page.hidden_note.text()
    page_screenshot(page, "models_catalog_fits_only")


def test_every_page_fits_800x560(app_env, qtbot):
    from PySide6.QtWidgets import QScrollArea

    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.resize(800, 560)
    qtbot.wait(50)
    assert (window.width(), window.height()) == (800, 560)
    for page in ("chat", "models", "settings"):
        window.show_page(page)
        qtbot.wait(50)
        screenshot(window, f"window_800x560_{page}")
        if page != "chat":
            scroll = window.stack.currentWidget().findChild(QScrollArea)
            assert scroll.widget().minimumSizeHint().width() <= scroll.viewport().width(), f"{page} is clipped"
            page_screenshot(window.stack.currentWidget(), f"window_800_wide_{page}_whole")


def test_ctrl_number_switches_pages(app_env, qtbot):
    from PySide6.QtGui import QShortcut

    window = open_window(qtbot, make_context(app_env), autoload=False)
    shortcuts = {s.key().toString(): s for s in window.findChildren(QShortcut)}
    for keys, page in (("Ctrl+1", "chat"), ("Ctrl+3", "settings"), ("Ctrl+2", "models")):
        assert shortcuts[keys].parent() is window                  # window-wide, whichever page has focus
        shortcuts[keys].activated.emit()      # the offscreen platform has no active window to take key presses
        assert window.current_page == page and window.nav_buttons[page].isChecked()
    assert window.nav_buttons["models"].toolTip() == "Models (Ctrl+2)"


def test_disabled_controls_say_why(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    send_button = window.chat.composer.send_button
    assert not send_button.isEnabled() and send_button.toolTip() == window.chat.composer._blocked_reason != ""
    apply = window.settings_page.apply_engine
    assert not apply.isEnabled() and apply.toolTip().startswith("Nothing to apply")
    window.settings_page.profile_buttons["C4"].click()
    assert apply.isEnabled() and apply.toolTip() == "Keep these settings for the next load"
    window.chat.set_model("Scripted")
    assert send_button.isEnabled() and send_button.toolTip() == "Send (Enter)"
