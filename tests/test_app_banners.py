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
