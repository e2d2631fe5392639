"""Issue 47, item 8: keyboard and focus: Ctrl+1 / Ctrl+N put the cursor in the message box, the shortcut sheet
(F1, Ctrl+/) lists every shortcut, the style sheet draws keyboard focus, icon-only buttons have names."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QToolButton

from app.shortcuts import SHORTCUTS, ShortcutSheet
from tests.app_support import make_context, open_window, screenshot


def shown_sheets():
    return [w for w in QApplication.topLevelWidgets() if isinstance(w, ShortcutSheet) and w.isVisible()]


def test_ctrl_1_and_ctrl_n_put_the_cursor_in_the_message_box(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    box = window.chat.composer.input
    window.show_page("models")
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    assert window.current_page == "chat"
    qtbot.waitUntil(box.hasFocus)
    window.chat.conversations.search.setFocus()
    qtbot.keyClick(window.chat.conversations.search, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(box.hasFocus)
    qtbot.keyClicks(QApplication.focusWidget(), "hello")
    assert box.toPlainText() == "hello"                         # typed text lands in the message box
    assert window.chat.composer.property("focused") is True     # and its frame shows the focus
    screenshot(window, "keyboard_message_box_focused")


def test_f1_and_ctrl_slash_show_every_shortcut(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_F1)
    qtbot.waitUntil(lambda: len(shown_sheets()) == 1)
    sheet = shown_sheets()[0]
    assert {combo for combo, _ in SHORTCUTS.values()} <= {combo for combo, _ in sheet.rows}
    screenshot(sheet, "keyboard_shortcut_sheet")
    sheet.close()
    qtbot.waitUntil(lambda: not shown_sheets())
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_Slash, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: len(shown_sheets()) == 1)
    shown_sheets()[0].close()


def test_focus_is_drawn_and_icon_buttons_have_names(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    sheet = QApplication.instance().styleSheet()
    for selector in ("QPushButton:focus", "QToolButton:focus", "QCheckBox::indicator:focus", "QComboBox:focus",
                     "QLineEdit:focus"):
        assert selector in sheet
    nameless = [b for b in window.findChildren(QToolButton)
                if b.isVisibleTo(window) and not b.text() and not b.accessibleName()]
    assert nameless == []
    window.show_page("settings")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    button = window.settings_page.profile_buttons["C2"]
    button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(button.hasFocus)
    screenshot(window, "keyboard_focus_on_a_button")
