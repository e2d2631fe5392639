"""Issue 47, item 16: the questions use the app's own glyph and plain buttons (a standard Cancel renamed "Keep"
carried the style's red ✗)."""

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app import dialogs
from tests.app_support import screenshot


def answer(qtbot, pick: str, seen: list) -> None:
    def look():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, look)
            return
        # no standard buttons (the style gives them stock icons: a red ✗ on Cancel renamed Keep), the app's glyph
        seen.append({b.text(): box.standardButton(b) == QMessageBox.StandardButton.NoButton for b in box.buttons()})
        assert box.icon() == QMessageBox.Icon.NoIcon and not box.iconPixmap().isNull()
        screenshot(box, "dialog_confirm")
        next(b for b in box.buttons() if b.text() == pick).click()

    QTimer.singleShot(20, look)


def test_confirm_has_plain_buttons_and_keep_is_the_default(app_env, qtbot):
    seen = []
    answer(qtbot, "Keep", seen)
    assert not dialogs.confirm(None, "Delete model", "Delete base from disk?", "Delete", keep="Keep")
    assert seen == [{"Keep": True, "Delete": True}]
    answer(qtbot, "Delete", seen)
    assert dialogs.confirm(None, "Delete model", "Delete base from disk?", "Delete", keep="Keep")
