"""Issue 47, item 14: a folder added on the Models page can be removed there (nothing else is deleted)."""

from pathlib import Path

from tests.app_support import make_context, open_window, page_screenshot


def test_an_added_folder_is_listed_and_can_be_removed(app_env, qtbot, checkpoint):
    path = Path(checkpoint())
    window = open_window(qtbot, make_context(app_env), autoload=False)
    page = window.models
    page.add_model_folder(str(path.parent))
    assert [m.path for m in page.local] == [str(path)]
    row = page.folders_box.itemAt(0).widget()
    assert str(path.parent) in row.findChild(type(page.search_status)).text()
    page_screenshot(page, "models_added_folder")
    remove = next(b for b in row.findChildren(type(page.search_button)) if b.text() == "Remove")
    remove.click()
    assert page.local == [] and window.context.settings.model_folders == [] and page.folders_box.count() == 0
    assert window.context.store.get_setting("app_settings")["model_folders"] == []
    assert (path / "config.json").is_file()                 # the checkpoint itself is untouched


def test_the_models_page_with_a_folder_and_a_checkpoint_fits_800_pixels(app_env, qtbot, checkpoint):
    from PySide6.QtWidgets import QScrollArea

    path = Path(checkpoint())
    window = open_window(qtbot, make_context(app_env, model_folders=[str(path.parent)]), autoload=False)
    window.resize(800, 560)
    qtbot.waitUntil(lambda: window.width() == 800)
    window.show_page("models")
    qtbot.waitUntil(lambda: window.models.grid_columns == 1)               # a narrow page: one column of cards
    area = window.models.findChild(QScrollArea)
    # nothing cut off on the right (once the layout has taken the single column)
    qtbot.waitUntil(lambda: area.widget().minimumSizeHint().width() <= area.viewport().width())
