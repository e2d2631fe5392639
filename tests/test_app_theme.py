"""The light theme: derived from the dark one colour by colour, chosen by the system's colour scheme."""

import pytest

from app import icons, theme
from tests.app_support import ScriptedBackend, make_context, open_window, screenshot, send, wait_reply


def test_light_colours_keep_their_contrasts():
    theme.scheme = "light"
    try:
        light = {k: theme.themed(v) for k, v in theme.COLORS.items()}
        lightness = lambda c: sum(int(c[i:i + 2], 16) for i in (1, 3, 5)) / 3      # noqa: E731
        assert lightness(light["window"]) > 220 and lightness(light["text"]) < 50
        assert lightness(light["window"]) > lightness(light["surface"]) > lightness(light["input"])
        assert lightness(light["muted"]) < 140 and theme.themed("#ffffff") == "#ffffff"     # text on the accent
        assert theme.themed_text("color: #e4e5e9; x #123") == f"color: {light['text']}; x #123"
    finally:
        theme.scheme = "dark"
    assert theme.themed("#e4e5e9") == "#e4e5e9"


@pytest.fixture
def light(qapp):
    theme.apply_theme(qapp, "light")
    icons.icon.cache_clear()
    yield
    theme.apply_theme(qapp, "dark")
    icons.icon.cache_clear()


def test_the_light_theme_on_every_page(app_env, light, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    assert window.palette().color(window.backgroundRole()).lightness() > 220
    reply = ("Here is **bold** text, a [link](https://example.com), `code`, and a table:\n\n| a | b |\n|---|---|\n"
             "| 1 | 2 |\n\n> a quote\n\n```python\ndef f(x):\n    return x + 1  # one more\n```\n")
    window.session.set_backend(ScriptedBackend([(reply, "")]))
    window.chat.set_model("Scripted")
    window.show_page("chat")
    send(qtbot, window, "Show me some markdown")
    wait_reply(qtbot, window)
    screenshot(window, "light_chat")
    for page in ("models", "settings"):
        window.show_page(page)
        screenshot(window, f"light_{page}")
