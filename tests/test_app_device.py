"""Issue 47, item 4: the device setting cannot strand the user: no "GPU" choice without one, and a reload that
fails leaves a page that says so, an Apply that goes back, and no stale error once a load works."""

import pytest
import torch
from PySide6.QtCore import Qt

from app.load_state import Phase
from tests.app_support import make_context, open_window, page_screenshot, wait_ready

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has no CUDA GPU in these tests")


@pytest.fixture
def window(app_env, qtbot, checkpoint):
    context = make_context(app_env, last_model=str(checkpoint("base")), max_tokens=8, thinking=False)
    w = open_window(qtbot, context)
    wait_ready(qtbot, w)
    return w


def test_without_a_gpu_the_gpu_choice_is_off_and_says_why(window):
    page = window.settings_page
    gpu = page.device.findData("cuda")
    item = page.device.model().item(gpu)
    assert not item.isEnabled() and "no CUDA GPU found" in item.text()


def test_a_failed_reload_can_be_taken_back_and_leaves_no_stale_message(window, qtbot):
    page = window.settings_page
    window.show_page("settings")
    page.device.setCurrentIndex(page.device.findData("cuda"))       # e.g. settings kept from a machine with a GPU
    states = []
    window.engine.state_changed.connect(lambda state: states.append(state.phase))
    qtbot.mouseClick(page.apply_engine, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: states[-1:] == [Phase.FAILED], timeout=30_000)
    assert window.engine.model is None
    assert "runs with profile" not in page.engine_status.text() and "could not be loaded" in page.engine_status.text()
    assert page.plans.note.text() == "No plan: device 'cuda' was asked for but no CUDA GPU is available."
    page_screenshot(page, "settings_after_a_failed_device_change")
    page.device.setCurrentIndex(page.device.findData("auto"))
    assert page.apply_engine.isEnabled()
    qtbot.mouseClick(page.apply_engine, Qt.MouseButton.LeftButton)
    wait_ready(qtbot, window)
    assert window.context.settings.device == "auto"
    assert not [t for t in window.chat.banner.texts() + window.models.banner.texts() if "load" in t.lower()]
    assert "runs with profile" in page.engine_status.text()
