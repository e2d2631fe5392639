"""Banners stack instead of overwriting each other."""

from PySide6.QtCore import Qt

from tests.app_support import make_context, open_window, screenshot


def test_banners_stack_newest_first(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.show_page("chat")
    stack = window.chat.banner
    stack.clear()
    assert stack.isHidden()
    opened = []
    window.chat.open_models_requested.connect(lambda: opened.append(True))
    window.chat.show_banner("warning", "No CUDA GPU found.")
    window.chat.show_banner("error", "The model could not be loaded.", "Models")
    assert stack.texts() == ["The model could not be loaded.", "No CUDA GPU found."]
    assert all(b.isVisible() for b in stack.banners)
    window.chat.show_banner("warning", "No CUDA GPU found.")             # again: moved up, not repeated
    assert stack.texts() == ["No CUDA GPU found.", "The model could not be loaded."]
    screenshot(window, "chat_banners_stacked")
    qtbot.mouseClick(stack.banners[1].action, Qt.MouseButton.LeftButton)
    assert opened == [True] and window.current_page == "models"
    window.show_page("chat")
    qtbot.mouseClick(stack.banners[0].close_button, Qt.MouseButton.LeftButton)
    assert stack.texts() == ["The model could not be loaded."] and not stack.isHidden()
    for i in range(5):
        window.chat.show_banner("info", f"Message {i}")
    assert stack.texts() == ["Message 4", "Message 3", "Message 2"]
    stack.clear()
    assert stack.isHidden()


def test_the_cpu_warning_is_said_once_and_leaves_room_at_the_smallest_size(app_env, qtbot, checkpoint):
    """It came twice, worded differently, from the window and the engine thread; with an error they took ~30% of
    the window at 800x560."""
    from tests.app_support import wait_ready

    window = open_window(qtbot, make_context(app_env, last_model=str(checkpoint("base"))))
    wait_ready(qtbot, window)
    window.resize(800, 560)
    window.show_page("chat")
    window.chat.show_banner("error", "base could not be loaded: something went wrong while reading its weights.")
    texts = window.chat.banner.texts()
    assert len(texts) == 2 and sum("CPU" in t for t in texts) == 1
    qtbot.waitUntil(lambda: window.height() == 560)
    screenshot(window, "chat_cpu_warning_and_an_error_800x560")
    assert window.chat.banner.height() < 0.2 * window.height()
