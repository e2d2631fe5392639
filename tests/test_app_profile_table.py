"""Issue 47, item 11: the Settings profile table clipped its text at 800x560 ("16-bit, 768.2 MiE",
"Context per requ")."""

from PySide6.QtWidgets import QLabel, QScrollArea

from tests.app_support import make_context, open_window, screenshot, wait_ready


def clipped(table) -> list[str]:
    out = []
    for i in range(table.grid.count()):
        cell = table.grid.itemAt(i).widget()
        if isinstance(cell, QLabel) and cell.isVisible() and not cell.wordWrap() \
                and cell.fontMetrics().horizontalAdvance(cell.text()) > cell.contentsRect().width():
            out.append(cell.text())
    return out


def test_no_cell_of_the_profile_table_is_clipped_at_the_smallest_window(app_env, qtbot, checkpoint):
    window = open_window(qtbot, make_context(app_env, last_model=str(checkpoint("base"))))
    wait_ready(qtbot, window)
    window.resize(800, 560)
    window.show_page("settings")
    qtbot.waitUntil(lambda: window.width() == 800)
    table = window.settings_page.plans
    qtbot.waitUntil(lambda: table.grid.count() > 8)
    screenshot(window, "settings_profile_table_800x560")
    assert clipped(table) == []
    viewport = window.settings_page.findChild(QScrollArea).viewport()     # and nothing runs off the page's right
    right = table.mapTo(viewport, table.rect().topRight()).x()
    assert right <= viewport.width()
