"""Issue 47, item 5: the wheel over a Settings drop-down scrolls the page; it changed the KV cache silently."""

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea

from tests.app_support import make_context, open_window


def wheel(widget, steps: int = -1) -> None:
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(), QPoint(0, 120 * steps),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_the_wheel_scrolls_past_an_unfocused_drop_down_and_changes_a_focused_one(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.resize(800, 560)
    window.show_page("settings")
    page = window.settings_page
    bar = page.findChild(QScrollArea).verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    window.setFocus()
    before = page.kv_dtype.currentData()
    wheel(page.kv_dtype)
    wheel(page.max_tokens)
    assert page.kv_dtype.currentData() == before and page.max_tokens.value() == page.current().max_tokens
    assert bar.value() > 0                                   # the page scrolled instead
    assert not page.apply_engine.isEnabled()
    page.kv_dtype.setFocus()
    qtbot.waitUntil(page.kv_dtype.hasFocus)
    wheel(page.kv_dtype)
    assert page.kv_dtype.currentData() != before             # focused: the wheel is the user's choice
